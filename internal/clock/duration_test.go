package clock

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90s": 90 * time.Second, "24h": 24 * time.Hour, "1d": 24 * time.Hour, "7d": 7 * 24 * time.Hour,
		"0d": 0, " 30d ": 30 * 24 * time.Hour, "1h30m": 90 * time.Minute, "36500d": MaxDays * 24 * time.Hour,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "1.5d", "-1d", "36501d", "1w", "seven days"} {
		if d, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %s, want an error", in, d)
		}
	}
}
