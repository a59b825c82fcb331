package events

// DecodeValid is decodeValid, for the tests of package events_test.
var DecodeValid = decodeValid

// EncodeWithoutLibrary is Encode's own writer (false when it hands the
// event to the library), and EncodeWithLibrary the library's: the
// reference.
func EncodeWithoutLibrary(e Event) ([]byte, bool) { return e.appendEncoded(nil) }

func EncodeWithLibrary(e Event) ([]byte, error) { return marshal(e) }

// DecodePayloadWithLibrary is unmarshalPayload: decodePayload's
// reference.
var DecodePayloadWithLibrary = unmarshalPayload

// ScannedObject is the scanner's answer to validObject.
var ScannedObject = scannedObject
