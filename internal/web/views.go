package web

import (
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/internal/forensics"
)

// The geometry of a turn band's drawing (SVG user units).
const (
	bandWidth = 1000.0
	laneH     = 20.0
	laneGap   = 4.0
	tickRow   = 16.0
)

// bandView is a turn band with the geometry of its drawing: each tool
// call a bar in its lane, each stage a tick.
type bandView struct {
	forensics.TurnBand
	Height float64
	LanesY float64
	Spans  []spanView
	Ticks  []tickView
	Took   string
}

type spanView struct {
	forensics.ToolSpan
	X, W, Y float64
	TextX   float64
	Took    string
	Label   string
}

type tickView struct {
	X     float64
	Stage string
	Seq   uint64
	Took  string
}

// bands lays out each turn's drawing: x is time from the turn's start to
// its end (or its latest event), y a lane; calls that overlap in time sit
// in different lanes, side by side.
func bands(ts []forensics.TurnBand) []bandView {
	out := make([]bandView, 0, len(ts))
	for _, t := range ts {
		start, end := t.Start, t.End
		for _, sp := range t.Tools {
			if sp.End.After(end) {
				end = sp.End
			}
			if sp.Start.After(end) {
				end = sp.Start
			}
		}
		for _, st := range t.Stages {
			if st.Time.After(end) {
				end = st.Time
			}
		}
		total := end.Sub(start)
		if total <= 0 {
			total = time.Second
		}
		x := func(at time.Time) float64 {
			if at.IsZero() || at.Before(start) {
				return 0
			}
			return min(bandWidth, float64(at.Sub(start))/float64(total)*bandWidth)
		}
		v := bandView{TurnBand: t}
		if len(t.Stages) > 0 {
			v.LanesY = tickRow
		}
		v.Height = v.LanesY + float64(max(t.Lanes, 1))*(laneH+laneGap) + laneGap
		for _, st := range t.Stages {
			v.Ticks = append(v.Ticks, tickView{X: x(st.Time), Stage: st.Stage, Seq: st.Seq, Took: ms(st.DurationMS)})
		}
		for _, sp := range t.Tools {
			to := sp.End
			if to.IsZero() {
				to = end
			}
			sv := spanView{ToolSpan: sp, X: x(sp.Start), Y: v.LanesY + laneGap + float64(sp.Lane)*(laneH+laneGap), Took: ms(sp.DurationMS)}
			minW := 3.0
			if sp.End.IsZero() {
				minW = 14 // a call with no end (orphaned, repaired, running) stays visible
			}
			sv.W = max(x(to)-sv.X, minW)
			sv.X = max(0, min(sv.X, bandWidth-sv.W)) // a call at the turn's very end stays inside
			sv.TextX = sv.X + 4
			// A label only where it fits (about 6.5 units a character at
			// the drawing's scale); the bar's tooltip always names it.
			for _, l := range []string{sp.Name + " " + sv.Took, sp.Name} {
				if float64(len(l))*6.5+6 <= sv.W {
					sv.Label = l
					break
				}
			}
			v.Spans = append(v.Spans, sv)
		}
		switch {
		case t.DurationMS > 0:
			v.Took = ms(t.DurationMS)
		case !t.End.IsZero():
			v.Took = ms(t.End.Sub(t.Start).Milliseconds())
		}
		out = append(out, v)
	}
	return out
}

// ms formats milliseconds for people: "850ms", "2.3s", "4m05s".
func ms(n int64) string {
	switch {
	case n <= 0:
		return ""
	case n < 1000:
		return strconv.FormatInt(n, 10) + "ms"
	case n < 60_000:
		return strconv.FormatFloat(float64(n)/1000, 'f', 1, 64) + "s"
	}
	d := time.Duration(n) * time.Millisecond
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"clock": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("15:04:05.000")
	},
	"ms":  ms,
	"dur": func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() },
	"add": func(a, b int) int { return a + b },
	"eventURL": func(base string, seq uint64) string {
		return base + "/event/" + strconv.FormatUint(seq, 10)
	},
	"untilURL": func(base string, seq uint64) string {
		return base + "?until_seq=" + strconv.FormatUint(seq, 10) + "#e" + strconv.FormatUint(seq, 10)
	},
	"sessionURL": sessionPath,
	"join":       strings.Join,
	"list":       func(xs ...string) []string { return xs },
	"f1":         func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"short": func(s string, n int) string {
		r := []rune(s)
		if len(r) <= n {
			return s
		}
		return string(r[:n]) + "…"
	},
	"incidentURL": func(id, query string) string {
		u := Prefix + "incidents/" + id
		if query != "" {
			u += "?" + query
		}
		return u
	},
	"pct": func(n, of int) string {
		if of == 0 {
			return "0"
		}
		return strconv.Itoa(n * 100 / of)
	},
}
