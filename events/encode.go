package events

import (
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// appendEncoded appends e's body, as marshal writes it (Encode's
// reference), to dst without reflection, and reports whether it could:
// the envelope's strings quoted by jsontext.AppendQuote (the library's
// own quoting), the time in RFC 3339 with nanoseconds (the library's
// form, for years 0 to 9999 and zones within 24 hours of UTC), and Data
// as it is when it is already in the form the library would write it in
// (canonicalData). For anything else (invalid UTF-8, a time out of range,
// data to reformat or refuse) it reports false, and Encode asks the
// library.
func (e *Event) appendEncoded(dst []byte) ([]byte, bool) {
	// The library refuses a year outside 0-9999 and a zone 24 hours or
	// more from UTC (go-json-experiment/json, arshal_time.go).
	_, offset := e.Time.Zone()
	if y := e.Time.Year(); y < 0 || y > 9999 || offset <= -24*3600 || offset >= 24*3600 || !canonicalData(e.Data) {
		return nil, false
	}
	var err error
	str := func(name, s string) {
		if err == nil {
			dst = append(dst, name...)
			dst, err = jsontext.AppendQuote(dst, s)
		}
	}
	dst = append(dst, '{')
	str(`"specversion":`, e.SpecVersion)
	str(`,"id":`, e.ID)
	str(`,"type":`, string(e.Type))
	str(`,"source":`, e.Source)
	if err != nil {
		return nil, false
	}
	dst = append(dst, `,"time":"`...)
	dst = e.Time.AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	str(`,"tenant":`, e.Tenant)
	str(`,"session":`, e.Session)
	if e.Turn != "" {
		str(`,"turn":`, e.Turn)
	}
	if err != nil {
		return nil, false
	}
	dst = append(dst, `,"data":`...)
	dst = append(dst, e.Data...)
	return append(dst, '}'), true
}

// canonicalData reports whether data is one valid JSON value (the
// library's rules: no duplicate names, valid UTF-8 and escapes) already
// in the form the library's encoder writes a raw value in
// (jsontext.Value.Format): no white space outside strings, and no escape
// in a string but \" \\ \b \f \n \r \t and \u00XX (lower-case hex) for
// the other control characters. Numbers are written as they are.
func canonicalData(data []byte) bool {
	return len(data) > 0 && withScanner(data, func(sd *storedDecoder) bool {
		sc := &sd.sc
		sc.checkEscapes = true
		return sc.skip(0) && sc.i == len(data) && !sc.spaced && !sc.oddEscape
	})
}

// scannedObject reports whether the scanner reads b as one JSON object
// and nothing else (validObject's first answer).
func scannedObject(b []byte) bool {
	return withScanner(b, func(sd *storedDecoder) bool {
		sc := &sd.sc
		return sc.peek() == '{' && sc.skip(0) && sc.atEnd()
	})
}
