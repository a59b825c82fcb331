package resend

import (
	"testing"
	"time"
)

// The window an ingest lane sends refused events again in is the log's
// Tries' pauses, rounded up to a tenth of a second: a change to either
// shows here.
func TestWindowIsTheTriesPauses(t *testing.T) {
	n := nominal()
	if Window < n || Window-n >= 100*time.Millisecond {
		t.Fatalf("Window %s, the %d tries' nominal pauses %s: Window should be their sum rounded up to 100 ms", Window, Tries, n)
	}
	b := BackOff()
	var max time.Duration
	for range Tries - 1 {
		d := b.NextBackOff()
		if d <= 0 || d > time.Duration(float64(Longest)*1.5) {
			t.Fatalf("pause %s: outside (0, 1.5 x %s]", d, Longest)
		}
		max = d
	}
	if max < Longest/2 {
		t.Fatalf("the last pause %s: the schedule should reach about %s", max, Longest)
	}
}

// nominal is the sum of the Tries-1 pauses without their randomization.
func nominal() time.Duration {
	var sum time.Duration
	p := First
	for range Tries - 1 {
		sum += p
		p = min(time.Duration(float64(p)*Growth), Longest)
	}
	return sum
}
