package filter

import "errors"

// ErrInvalidFilter is wrapped by every error Parse returns. The message says
// what is wrong and at which byte offset of the filter; for
// attributes.name = com it is
//
//	invalid filter at offset 18: expected a string literal after "=", found "com"
//
// The sidecar returns it as gRPC INVALID_ARGUMENT; callers match it with
// errors.Is, never by its text.
var ErrInvalidFilter = errors.New("invalid filter")
