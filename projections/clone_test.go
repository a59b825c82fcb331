package projections

import (
	"reflect"
	"testing"
	"time"
)

// TestCloneSharesNothing fills every field of a state that reflection
// reaches (every pointer set, every slice and map given an element, all
// the way down), clones it, and checks that the copy equals the original
// and shares no slice, map or pointer with it. A field added to Session
// (or to a type it holds) that Clone does not copy fails here.
func TestCloneSharesNothing(t *testing.T) {
	s := &Session{}
	fill(reflect.ValueOf(s).Elem())
	c := s.Clone()
	if !reflect.DeepEqual(c, s) {
		t.Fatalf("the clone differs:\n got %+v\nwant %+v", c, s)
	}
	var paths []string
	shared(reflect.ValueOf(s).Elem(), reflect.ValueOf(c).Elem(), "Session", &paths)
	if len(paths) > 0 {
		t.Fatalf("Clone shares %v with the original", paths)
	}

	// A real state, folded on from its clone, leaves the original as it
	// was, and folds like the original.
	evs := synth(t, 7, 80, true)
	half := FoldLog(evs[:len(evs)/2])
	before := mustJSON(t, half)
	clone := half.Clone()
	for _, ev := range evs[len(evs)/2:] {
		clone.Apply(ev)
		if clone.NeedsRefold {
			if err := clone.Refold(sliceSource(evs)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if string(mustJSON(t, half)) != string(before) {
		t.Fatal("folding the clone changed the original")
	}
	if got, want := fingerprint(t, clone), fingerprint(t, FoldLog(evs)); string(got) != string(want) {
		t.Fatalf("the clone folded on differs from the full fold:\n%s", diffAt(got, want))
	}
}

var timeType = reflect.TypeOf(time.Time{})

// fill sets every settable zero part of v: strings, numbers and booleans
// to a value, pointers to a filled value, slices and maps to one filled
// element.
func fill(v reflect.Value) {
	if v.Type() == timeType {
		v.Set(reflect.ValueOf(time.Unix(1700000000, 0).UTC()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		v.SetUint(1)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// shared appends to paths every slice, map or pointer a and b share.
func shared(a, b reflect.Value, path string, paths *[]string) {
	if a.Type() == timeType {
		return // its location is shared, and never changes
	}
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() {
			return
		}
		if a.Pointer() == b.Pointer() {
			*paths = append(*paths, path)
		}
		shared(a.Elem(), b.Elem(), path, paths)
	case reflect.Slice:
		if a.Len() > 0 && a.Pointer() == b.Pointer() {
			*paths = append(*paths, path)
		}
		for i := 0; i < min(a.Len(), b.Len()); i++ {
			shared(a.Index(i), b.Index(i), path+"[i]", paths)
		}
	case reflect.Map:
		if !a.IsNil() && a.Pointer() == b.Pointer() {
			*paths = append(*paths, path)
		}
		for _, k := range a.MapKeys() {
			if bv := b.MapIndex(k); bv.IsValid() {
				shared(a.MapIndex(k), bv, path+"[k]", paths)
			}
		}
	case reflect.Struct:
		for i := 0; i < a.NumField(); i++ {
			if a.Type().Field(i).IsExported() {
				shared(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name, paths)
			}
		}
	}
}
