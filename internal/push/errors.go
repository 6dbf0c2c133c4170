package push

import "errors"

var (
	// ErrInvalidAllowList is returned by ParseAllowList for an entry it
	// cannot read; the error names the entry.
	ErrInvalidAllowList = errors.New("push: invalid --push-allow entry")

	// ErrInvalidEndpoint is returned by AllowList.Check for a push endpoint
	// that is not an absolute http or https URL with a host and no userinfo.
	ErrInvalidEndpoint = errors.New("push: invalid push endpoint")

	// ErrNotAllowed is returned by AllowList.Check when the endpoint's host
	// (or port) is not on the allow-list, and by Client.Deliver (in
	// Result.Err) when the host resolved only to addresses the allow-list
	// refuses.
	ErrNotAllowed = errors.New("push: endpoint not allowed")

	// ErrInvalidPushConfig is returned by ParseFormat and
	// CheckPushAttributes for a push configuration the sidecar does not
	// support.
	ErrInvalidPushConfig = errors.New("push: unsupported push configuration")

	// ErrUnencodable is returned by NewRequest when the message cannot be
	// put in the chosen format (an attribute that is not a valid HTTP header
	// name or value, or one that would change the request's framing). Such
	// a message is poison for this subscription: the runner nacks it with
	// backoff like any failure, so it stays until the format changes or the
	// dead-letter policy takes it.
	ErrUnencodable = errors.New("push: message cannot be encoded as a push request")

	// ErrStatus is in Result.Err when the endpoint answered with a status
	// code Pub/Sub does not count as an ack.
	ErrStatus = errors.New("push: endpoint returned a non-success status")

	// ErrRedirect is in Result.Err when the endpoint answered with a 3xx:
	// redirects are never followed.
	ErrRedirect = errors.New("push: endpoint redirected (redirects are not followed)")

	// ErrTimeout is in Result.Err when no answer came within the timeout
	// (the ack deadline).
	ErrTimeout = errors.New("push: endpoint did not answer within the ack deadline")

	// ErrRefused is in Result.Err when the connection was refused.
	ErrRefused = errors.New("push: connection refused")
)
