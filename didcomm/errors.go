package didcomm

import "errors"

// Errors about a message's sequencing headers. Reading or tracking a message
// returns one of them, wrapped with details; match with errors.Is.
var (
	// ErrInvalidSenderOrder: sender_order is not a whole number >= 1 (0,
	// negative, fractional, exponent form, a string, or beyond uint64).
	ErrInvalidSenderOrder = errors.New("didcomm: invalid sender_order")
	// ErrInvalidSentCount: sent_count is not a whole number >= 1.
	ErrInvalidSentCount = errors.New("didcomm: invalid sent_count")
	// ErrInvalidReceivedOrders: received_orders is not an array of
	// {"id": string, "last": n, "gaps": [n...]} with 1 <= gap < last.
	ErrInvalidReceivedOrders = errors.New("didcomm: invalid received_orders")
	// ErrInvalidHeader: id, thid or from is not a non-empty string, or a
	// NATS header value is not validly encoded.
	ErrInvalidHeader = errors.New("didcomm: invalid header")
	// ErrMissingID: a sequenced message (one with sender_order) has no id.
	ErrMissingID = errors.New("didcomm: sequenced message without id")
	// ErrMissingSender: a sequenced message has no from: its sender_order
	// cannot be attributed to anyone.
	ErrMissingSender = errors.New("didcomm: sequenced message without from")
	// ErrNotSequenced: the tracker was given a message without sender_order.
	ErrNotSequenced = errors.New("didcomm: message has no sender_order")
	// ErrTooManySenders: a thread already tracks MaxSendersPerThread senders
	// and a message came from another one; it is not tracked.
	ErrTooManySenders = errors.New("didcomm: too many senders in one thread")
	// ErrStateTooLarge: saving the thread's state would pass MaxStateBytes
	// (possible only with limits raised above their defaults); the message
	// is not tracked.
	ErrStateTooLarge = errors.New("didcomm: thread state too large")
	// ErrStateConflict is returned by a Store's Save when the state changed
	// since it was loaded; the tracker then loads it again and retries.
	ErrStateConflict = errors.New("didcomm: tracker state changed concurrently")
)
