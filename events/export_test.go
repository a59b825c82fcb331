package events

// DecodeValid is decodeValid, for the tests of package events_test.
var DecodeValid = decodeValid
