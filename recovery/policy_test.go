package recovery

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRetryPolicyDefaults(t *testing.T) {
	p := DefaultRetryPolicy()
	want := RetryPolicy{InitialInterval: 500 * time.Millisecond, MaxInterval: 30 * time.Second, Multiplier: 2, Jitter: 0.5, MaxAttempts: 3, MaxElapsed: 2 * time.Minute}
	if p != want {
		t.Fatalf("defaults = %+v, want %+v", p, want)
	}
	if err := (RetryPolicy{}).Validate(); err != nil {
		t.Fatalf("zero policy (defaults) invalid: %v", err)
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	p := RetryPolicy{InitialInterval: 10 * time.Second, MaxInterval: time.Second, Multiplier: 0.5, Jitter: 1.5, MaxAttempts: -1, MaxElapsed: -time.Second}
	err := p.Validate()
	if !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("err = %v, want ErrInvalidPolicy", err)
	}
	for _, field := range []string{"max_interval", "multiplier", "jitter", "max_attempts", "max_elapsed"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
}
