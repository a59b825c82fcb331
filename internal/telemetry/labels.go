package telemetry

import "github.com/turnstone-dev/turnstone/events"

// maxLabelLen is the longest label value taken from an event as it is.
const maxLabelLen = 64

// Label values that stand for others.
const (
	labelNone    = "none"    // the value was empty
	labelOther   = "other"   // the value was not a short token
	labelUnknown = "unknown" // an event type this version does not know
)

// label bounds a label value taken from an event or a caller: a token of 1
// to maxLabelLen characters of [A-Za-z0-9_.:-] is kept, an empty value
// becomes "none" and anything else "other". Free text (a reason such as
// "auto: context 92% full") would otherwise make one series per message,
// and invalid UTF-8 would make the registry refuse the value.
func label(s string) string {
	if s == "" {
		return labelNone
	}
	if len(s) > maxLabelLen {
		return labelOther
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == ':', c == '-':
		default:
			return labelOther
		}
	}
	return s
}

// typeLabel is t for a type of this version of the contract, "unknown" for
// any other (a newer publisher's type, or an event whose body did not
// decode), so events_total has a bounded set of series.
func typeLabel(t events.Type) string {
	if events.KnownType(t) {
		return string(t)
	}
	return labelUnknown
}

// breakerValue maps a breaker state of breaker.changed to the value of the
// breaker_state gauge, and reports whether the state is one it knows.
func breakerValue(state string) (float64, bool) {
	switch state {
	case "closed":
		return 0, true
	case "half_open":
		return 1, true
	case "open":
		return 2, true
	}
	return 0, false
}
