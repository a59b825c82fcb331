package cli

import (
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"github.com/turnstone-dev/turnstone/internal/clock"
)

// durationValue is a pflag.Value of a duration read by clock.ParseDuration:
// a Go duration or a whole number of days ("7d"), as the policy file takes
// them.
type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := clock.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) Type() string { return "duration" }

func (d *durationValue) String() string {
	v := time.Duration(*d)
	if v != 0 && v%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(v/(24*time.Hour)), 10) + "d"
	}
	return v.String()
}

// DurationVar defines a duration flag on fs that takes what the policy
// file takes (clock.ParseDuration): "90s", "24h", "7d".
func DurationVar(fs *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationValue)(p), name, usage)
}
