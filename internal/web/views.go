package web

import (
	"cmp"
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

// The geometry of a turn band's drawing (SVG user units).
const (
	bandWidth = 1000.0
	laneH     = 20.0
	laneGap   = 4.0
	tickRow   = 14.0
	// charW is the width of one character of a stage label (font-size
	// 10 in app.css) with room to spare, labelGap the least space
	// between two labels of one row.
	charW    = 6.2
	labelGap = 6.0
	// axisH is the height of the time axis under the lanes.
	axisH = 18.0
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
	// AxisY is the y of the time axis; Axis its marks.
	AxisY float64
	Axis  []axisMark
}

// axisMark is one mark of a band's time axis: the time since the turn's
// start at x.
type axisMark struct {
	X      float64
	Label  string
	Anchor string // the label's text-anchor: start, middle, end
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
	// TextX and TextY place its label, Anchor its text-anchor: labels
	// that would overlap go to rows below (layoutLabels).
	TextX, TextY float64
	Anchor       string
}

// layoutLabels places the stage labels of one band in rows so that no
// two overlap: each label, in x order, goes to the first row where it
// clears the previous label by labelGap; it is written right of its
// tick, or left of it when it would run past the band's end. It returns
// how many rows it used (at least 1).
func layoutLabels(ticks []tickView) int {
	var rowEnd []float64 // the right edge of each row's last label
	for i := range ticks {
		tk := &ticks[i]
		w := float64(len([]rune(tk.label()))) * charW
		start, anchor := tk.X+2, "start"
		if start+w > bandWidth {
			start, anchor = tk.X-2-w, "end"
		}
		start = max(start, 0)
		row := -1
		for r, end := range rowEnd {
			if start >= end+labelGap {
				row = r
				break
			}
		}
		if row < 0 {
			rowEnd = append(rowEnd, 0)
			row = len(rowEnd) - 1
		}
		rowEnd[row] = start + w
		tk.Anchor, tk.TextY = anchor, float64(row)*tickRow+11
		if anchor == "end" {
			tk.TextX = start + w
		} else {
			tk.TextX = start
		}
	}
	return max(len(rowEnd), 1)
}

// label is the text a tick shows.
func (t tickView) label() string {
	if t.Took == "" {
		return t.Stage
	}
	return t.Stage + " " + t.Took
}

// Label is the text a tick shows (for the template).
func (t tickView) Label() string { return t.label() }

// axisSteps are the spacings a time axis chooses from.
var axisSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
	10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute,
	15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// axis returns the marks of a time axis over total: the smallest step
// from axisSteps that makes at most 8 intervals, a mark at each multiple
// of it, labelled with the time since the start ("0", "+2s", "+1m00s").
func axis(total time.Duration) []axisMark {
	step := axisSteps[len(axisSteps)-1]
	for _, s := range axisSteps {
		if total/s <= 8 {
			step = s
			break
		}
	}
	var out []axisMark
	for at := time.Duration(0); at <= total; at += step {
		x := float64(at) / float64(total) * bandWidth
		m := axisMark{X: x, Label: "+" + ms(at.Milliseconds()), Anchor: "middle"}
		switch {
		case at == 0:
			m.Label, m.Anchor = "0", "start"
		case bandWidth-x < 30:
			m.Anchor = "end"
		}
		out = append(out, m)
	}
	return out
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
		for _, st := range t.Stages {
			v.Ticks = append(v.Ticks, tickView{X: x(st.Time), Stage: st.Stage, Seq: st.Seq, Took: ms(st.DurationMS)})
		}
		slices.SortStableFunc(v.Ticks, func(a, b tickView) int { return cmp.Compare(a.X, b.X) })
		if len(v.Ticks) > 0 {
			v.LanesY = float64(layoutLabels(v.Ticks)) * tickRow
		}
		v.AxisY = v.LanesY + float64(max(t.Lanes, 1))*(laneH+laneGap) + laneGap
		v.Height = v.AxisY + axisH
		v.Axis = axis(total)
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
	"ms":   ms,
	"dur":  func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() },
	"add":  func(a, b int) int { return a + b },
	"addf": func(a, b float64) float64 { return a + b },
	// abandonedBy says how a turn was abandoned, from its cause.
	"abandonedBy": func(cause string) string {
		if how := projections.AbandonedHow(cause); how != "" {
			return how
		}
		return "(cause not recorded)"
	},
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
