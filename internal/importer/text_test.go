package importer_test

import (
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/internal/importer"
)

func TestLineReader(t *testing.T) {
	in := "a\r\n" + strings.Repeat("x", 20) + "\nbb\n\nccc"
	lr := importer.NewLineReader(strings.NewReader(in), 10)
	type got struct {
		line    string
		tooLong bool
	}
	var lines []got
	for {
		l, tooLong, ok, err := lr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		lines = append(lines, got{string(l), tooLong})
	}
	want := []got{{"a", false}, {"", true}, {"bb", false}, {"", false}, {"ccc", false}}
	if len(lines) != len(want) {
		t.Fatalf("lines = %+v, want %+v", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i+1, lines[i], want[i])
		}
	}
}
