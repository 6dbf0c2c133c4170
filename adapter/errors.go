package adapter

import (
	"errors"

	"github.com/jetorder/jetorder/keyrouter"
)

// Errors returned by the adapter. Each is matched with errors.Is; most are
// returned wrapped with the name they concern.
var (
	// ErrTopicNotFound is returned for a topic that does not exist: by
	// Topic.Config, Topic.Delete, Publish and CreateSubscription.
	ErrTopicNotFound = errors.New("topic not found")
	// ErrTopicExists is returned by CreateTopic for a topic that exists.
	ErrTopicExists = errors.New("topic already exists")
	// ErrTopicDeleted is returned by Receive when the subscription's topic
	// was deleted (before or during Receive). The topic's messages are gone
	// with it.
	ErrTopicDeleted = errors.New("topic of subscription was deleted")
	// ErrSubscriptionNotFound is returned for a subscription that does not
	// exist, and by Receive when the subscription is deleted while receiving.
	ErrSubscriptionNotFound = errors.New("subscription not found")
	// ErrDetached is returned by Receive on a subscription detached from
	// its topic (Subscription.Detach), before or during Receive.
	ErrDetached = errors.New("subscription is detached from its topic")
	// ErrSubscriptionExists is returned by CreateSubscription for an id in use.
	ErrSubscriptionExists = errors.New("subscription already exists")
	// ErrInvalidConfig is returned for a configuration value out of range.
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrInvalidMessage is returned by Publish for a message that breaks a
	// limit (attributes, size).
	ErrInvalidMessage = errors.New("invalid message")
	// ErrHandlerPanic is returned by Receive when a handler panicked. The
	// message it was handling is nacked, so it is redelivered in order.
	ErrHandlerPanic = errors.New("receive handler panicked")
	// ErrClosed is returned after Client.Close, by every call, and by
	// Receive calls that Close ended.
	ErrClosed = errors.New("client closed")
	// ErrCloseTimeout is returned by Client.Close when Receive calls or
	// topic publishers it waits for are still running after the close
	// timeout (WithCloseTimeout); the error names them. The client is
	// closed all the same, and they finish in the background.
	ErrCloseTimeout = errors.New("client close timed out")
)

// Confirmed ack errors (Message.AckWithResult).
var (
	// ErrAckInvalid is returned by AckWithResult when the ack cannot take
	// effect: the message was nacked or handed back first, its ack deadline
	// passed after its handler returned (the server redelivers it), a newer
	// delivery of it is held, or nobody at the server took the ack (its
	// consumer is gone). The message is, or will be, delivered again.
	ErrAckInvalid = errors.New("ack not valid: the message is delivered again")
	// ErrAckTimeout is returned by AckWithResult when the server did not
	// confirm the ack in time (it wraps the context's or the connection's
	// error). The server may or may not have the ack; calling AckWithResult
	// again sends it again.
	ErrAckTimeout = errors.New("ack not confirmed in time")
)

// Publisher errors.
var (
	// ErrPublishingPaused is returned for messages of an ordering key whose
	// publishing is paused: an earlier message of the key failed for good,
	// and storing later ones would break the key's order. ResumePublish
	// resumes the key.
	ErrPublishingPaused = errors.New("publishing paused for ordering key")
	// ErrTopicStopped is returned by Publish after Topic.Stop.
	ErrTopicStopped = errors.New("topic stopped for publishing")
	// ErrFlowControlLimit is returned by Publish when the outstanding
	// messages or bytes are at their limit and the limit is set to fail
	// rather than block.
	ErrFlowControlLimit = errors.New("publish flow control limit reached")
	// ErrNotDurable fails a publish that the server acknowledged but whose
	// sync to stable storage (WithDurableSync) failed: the message may be
	// stored, and may be lost in a power cut. Its key is paused.
	ErrNotDurable = errors.New("publish not confirmed on stable storage")
)

// The ordering key and name errors are keyrouter's; they are re-exported so
// adapter users need not import keyrouter to match them.
var (
	ErrEmptyOrderingKey      = keyrouter.ErrEmptyOrderingKey
	ErrOrderingKeyTooLong    = keyrouter.ErrOrderingKeyTooLong
	ErrOrderingKeyNotUTF8    = keyrouter.ErrOrderingKeyNotUTF8
	ErrInvalidProjectID      = keyrouter.ErrInvalidProjectID
	ErrInvalidTopicID        = keyrouter.ErrInvalidTopicID
	ErrInvalidSubscriptionID = keyrouter.ErrInvalidSubscriptionID
)
