package telemetry

import "testing"

func TestSetOpenIncidents(t *testing.T) {
	m := NewMetrics(Namespace)
	m.SetOpenIncidents(map[string]int{"overloaded": 2, "tool_use_without_result": 1, "free text!": 1})
	for class, want := range map[string]float64{"overloaded": 2, "tool_use_without_result": 1, "other": 1} {
		if got, ok := value(t, m.Registry(), "turnstone_incidents_open", map[string]string{"class": class}); !ok || got != want {
			t.Errorf("incidents_open{class=%q} = %v (%v), want %v", class, got, ok, want)
		}
	}
	// A class no longer open leaves no series.
	m.SetOpenIncidents(map[string]int{"overloaded": 1})
	if _, ok := value(t, m.Registry(), "turnstone_incidents_open", map[string]string{"class": "tool_use_without_result"}); ok {
		t.Error("a closed class kept its series")
	}
	var nilM *Metrics
	nilM.SetOpenIncidents(map[string]int{"x": 1}) // a nil *Metrics does nothing
}
