package events

// DecodeValid is decodeValid, for the tests of package events_test.
var DecodeValid = decodeValid

// EncodeWithoutLibrary is Encode's own writer (false when it hands the
// event to the library), and EncodeWithLibrary the library's: the
// reference.
func EncodeWithoutLibrary(e Event) ([]byte, bool) { return e.appendEncoded(nil) }

func EncodeWithLibrary(e Event) ([]byte, error) { return marshal(e) }

// DecodePayloadWithLibrary decodes data into a new payload of type t with
// the library alone: decodePayload's reference.
func DecodePayloadWithLibrary(t Type, data []byte) (Payload, error) {
	p := newPayload(t)
	if p == nil {
		return nil, ErrUnknownType
	}
	if err := unmarshal(data, p); err != nil {
		return nil, err
	}
	return p, nil
}

// ScannedObject is the scanner's answer to validObject.
var ScannedObject = scannedObject
