package resources

import (
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/status"
)

var (
	// ErrInvalid is returned, wrapped in an *Error, by Load and Parse for a
	// file that is not a valid resources file: not YAML or JSON, an
	// unknown or unsupported field, a value of the wrong type, a missing
	// required field, a bad duration or resource name. Nothing is applied.
	ErrInvalid = errors.New("not a valid resources file")
	// ErrFixed is returned, wrapped in an *Error, by Apply when the file
	// declares a setting of an existing resource that differs from what
	// the resource has and that cannot change after creation: a
	// subscription's topic, message ordering or filter, a label read only
	// at creation (pubsubapi.TopicCreationLabels and
	// SubscriptionCreationLabels), a schema's type or
	// definition.
	ErrFixed = errors.New("cannot change after creation")
)

// Error is one problem of one declaration in a resources file: where it
// is, which resource, and what is wrong. Err is ErrInvalid or ErrFixed
// (what is wrong in detail is in the message), or the API's error (a gRPC
// status) for a read, create or update the API refused; errors.Is and
// status.Code see through it.
type Error struct {
	File     string
	Line     int    // 0 when the problem is the file's as a whole
	Resource string // such as `subscription "orders"`; "" for the file
	Op       string // "create", "update" or "read" for the API's errors; "" otherwise
	Err      error
	detail   string // what is wrong, for ErrInvalid and ErrFixed
}

// Error reads file:line: resource: what is wrong.
func (e *Error) Error() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
	}
	if e.Resource != "" {
		s += ": " + e.Resource
	}
	if e.detail != "" {
		return s + ": " + e.detail
	}
	if st, ok := status.FromError(e.Err); ok {
		return fmt.Sprintf("%s: %s: %s (%s)", s, e.Op, st.Message(), st.Code())
	}
	return fmt.Sprintf("%s: %s: %v", s, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
