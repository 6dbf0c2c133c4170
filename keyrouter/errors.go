package keyrouter

import "errors"

// Ordering key errors. Their texts are the ones the ordering specification
// (BR-010) and Google Pub/Sub use, so clients that show the message see the
// familiar wording; callers match them with errors.Is.
var (
	// ErrEmptyOrderingKey is returned for a key that is present but empty.
	// In Go APIs the empty string means "no key"; this error is for the
	// places that can tell an absent key from an empty one.
	ErrEmptyOrderingKey = errors.New("Ordering key cannot be empty")
	// ErrOrderingKeyTooLong is returned for a key over MaxKeyBytes bytes.
	ErrOrderingKeyTooLong = errors.New("Ordering key exceeds maximum length of 1024 bytes")
	// ErrOrderingKeyNotUTF8 is returned for a key that is not valid UTF-8.
	ErrOrderingKeyNotUTF8 = errors.New("Ordering key must be valid UTF-8")
)

// Name errors, returned (wrapped, with the offending name) by the Validate
// functions.
var (
	ErrInvalidProjectID      = errors.New("invalid project id")
	ErrInvalidTopicID        = errors.New("invalid topic id")
	ErrInvalidSubscriptionID = errors.New("invalid subscription id")
	// ErrInvalidEncoding is returned by DecodeKey for a header value that is
	// not the percent-encoding EncodeKey writes.
	ErrInvalidEncoding = errors.New("invalid percent-encoding")
)
