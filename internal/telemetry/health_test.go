package telemetry

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHealthStatus(t *testing.T) {
	h := NewHealth()
	if rep := h.Status(context.Background()); !rep.OK() || len(rep.Checks) != 0 {
		t.Fatalf("empty health: %+v, want ok and no checks", rep)
	}

	var mu sync.Mutex
	var natsErr error
	h.Register("nats", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return natsErr
	})
	h.Set("projector", nil)
	rep := h.Status(context.Background())
	if !rep.OK() || rep.Checks["nats"].Status != StatusOK || rep.Checks["projector"].Status != StatusOK {
		t.Fatalf("all passing: %+v", rep)
	}

	mu.Lock()
	natsErr = errors.New("nats: connection closed")
	mu.Unlock()
	h.Set("projector", errors.New("consumer stalled"))
	rep = h.Status(context.Background())
	if rep.OK() || rep.Status != StatusFailing {
		t.Fatalf("two failing: %+v, want failing", rep)
	}
	for name, msg := range map[string]string{"nats": "nats: connection closed", "projector": "consumer stalled"} {
		if c := rep.Checks[name]; c.Status != StatusFailing || c.Error != msg {
			t.Errorf("check %s = %+v, want failing with %q", name, c, msg)
		}
	}

	h.Remove("nats")
	h.Set("projector", nil)
	if rep := h.Status(context.Background()); !rep.OK() || len(rep.Checks) != 1 {
		t.Errorf("after Remove and Set(nil): %+v", rep)
	}
	h.Register("projector", nil) // a nil check removes the name
	if rep := h.Status(context.Background()); len(rep.Checks) != 0 {
		t.Errorf("after Register(nil): %+v", rep)
	}
}

func TestHealthCheckPanicsAndHangs(t *testing.T) {
	var h Health // the zero value works
	h.Register("panics", func(context.Context) error { panic("kaboom") })
	h.Register("hangs", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep := h.Status(ctx)
	if took := time.Since(start); took > CheckTimeout {
		t.Errorf("Status took %v, beyond the caller's deadline", took)
	}
	if c := rep.Checks["panics"]; c.Status != StatusFailing || !strings.Contains(c.Error, "kaboom") {
		t.Errorf("panicking check: %+v", c)
	}
	if c := rep.Checks["hangs"]; c.Status != StatusFailing || !strings.Contains(c.Error, "deadline") {
		t.Errorf("hanging check: %+v", c)
	}
}

func TestNilHealth(t *testing.T) {
	var h *Health
	h.Register("x", func(context.Context) error { return errors.New("no") })
	h.Set("y", errors.New("no"))
	h.Remove("x")
	if rep := h.Status(context.Background()); !rep.OK() || rep.Checks == nil {
		t.Errorf("nil health: %+v, want ok with an empty checks map", rep)
	}
}

func TestHealthConcurrent(t *testing.T) {
	h := NewHealth()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				var err error
				if j%2 == 0 {
					err = errors.New("down")
				}
				h.Set("pushed", err)
				h.Register("polled", func(context.Context) error { return err })
				_ = h.Status(context.Background())
				if i == 0 && j == 50 {
					h.Remove("pushed")
				}
			}
		})
	}
	wg.Wait()
}
