package clock

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxDays is the most days ParseDuration takes ("36500d", a hundred years).
const MaxDays = 36500

// ParseDuration reads a duration as Turnstone's policy file and its
// commands take it: a Go duration ("90s", "2h30m", time.ParseDuration) or
// a whole number of days ("1d", "30d", at most MaxDays), the unit Go's
// parser lacks. Errors name the value and both forms.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if v, err := strconv.Atoi(days); err == nil && v >= 0 && v <= MaxDays {
			return time.Duration(v) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as \"90s\", \"24h\" or \"7d\"", s)
	}
	return d, nil
}
