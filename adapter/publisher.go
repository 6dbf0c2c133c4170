package adapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// LimitExceededBehavior says what Publish does when flow control limits are
// reached.
type LimitExceededBehavior int

const (
	// FlowControlBlock makes Publish wait (until its context ends) for
	// outstanding messages to complete.
	FlowControlBlock LimitExceededBehavior = iota
	// FlowControlSignalError makes Publish fail at once with
	// ErrFlowControlLimit.
	FlowControlSignalError
)

// DefaultPublishSettings are the batching, timeout and flow control
// settings a Topic handle publishes with: every zero field of
// Topic.PublishSettings takes its value from here.
var DefaultPublishSettings = PublishSettings{
	DelayThreshold: 10 * time.Millisecond,
	CountThreshold: 100,
	ByteThreshold:  1 << 20,
	Timeout:        60 * time.Second,
	FlowControlSettings: FlowControlSettings{
		MaxOutstandingMessages: 10000,
		MaxOutstandingBytes:    64 << 20,
	},
}

// MaxPublishTimeout keeps retries inside the topic stream's 2-minute
// duplicate window: a longer PublishSettings.Timeout is cut to it.
const MaxPublishTimeout = 90 * time.Second

// publisher batches a Topic handle's messages per ordering key and sends
// each key's batches one at a time, in Publish order. Within a batch the
// messages are pipelined (asynchronous publish on one connection, which the
// server stores in order). A batch whose failures form a suffix (every
// message after the first failure failed too) is retried from the first
// failure, still in order, with the same message ids, so JetStream's
// de-duplication stores each message once. Any other failure pattern, or a
// permanent error, pauses the key.
//
// The publisher does the I/O; its keyQueues decide when each batch goes.
type publisher struct {
	t      *Topic
	cfg    PublishSettings
	queues *keyQueues
	flow   *flowController
}

func newPublisher(t *Topic, cfg PublishSettings) *publisher {
	if cfg.DelayThreshold <= 0 {
		cfg.DelayThreshold = DefaultPublishSettings.DelayThreshold
	}
	if cfg.CountThreshold <= 0 {
		cfg.CountThreshold = DefaultPublishSettings.CountThreshold
	}
	if cfg.ByteThreshold <= 0 {
		cfg.ByteThreshold = DefaultPublishSettings.ByteThreshold
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultPublishSettings.Timeout
	}
	// A retry after the stream's duplicate window could store a message
	// twice.
	cfg.Timeout = min(cfg.Timeout, MaxPublishTimeout)
	fc := cfg.FlowControlSettings
	if fc.MaxOutstandingMessages == 0 {
		fc.MaxOutstandingMessages = DefaultPublishSettings.FlowControlSettings.MaxOutstandingMessages
	}
	if fc.MaxOutstandingBytes == 0 {
		fc.MaxOutstandingBytes = DefaultPublishSettings.FlowControlSettings.MaxOutstandingBytes
	}
	sender := cfg.SenderID
	if sender == uuid.Nil {
		sender = uuid.New()
	}
	p := &publisher{t: t, cfg: cfg, flow: newFlowController(fc)}
	p.queues = newKeyQueues(cfg, sequencer{sender: sender, next: cfg.FirstSequence},
		func(b *batch) { go p.sendBatch(b) }, p.complete, nil)
	return p
}

func newResult() *PublishResult { return &PublishResult{done: make(chan struct{})} }

// resolved is a result known at once (a message refused before queueing).
func resolved(id string, err error) *PublishResult {
	r := newResult()
	r.set(id, err)
	return r
}

func (r *PublishResult) set(id string, err error) {
	r.id, r.err = id, err
	close(r.done)
}

// add queues an encoded message. It returns once the message is queued (or
// refused); the result resolves when it is stored or has failed.
func (p *publisher) add(ctx context.Context, key string, msg *nats.Msg) *PublishResult {
	size := len(msg.Data) + len(msg.Subject) + 160 // identity headers
	for k, vals := range msg.Header {
		for _, v := range vals {
			size += len(k) + len(v) + 4
		}
	}
	if err := p.flow.acquire(ctx, size, p.queues.hurry); err != nil {
		return p.refuse(key, err)
	}
	res, err := p.queues.add(key, msg, size)
	if err != nil {
		p.flow.release(size)
		return resolved("", err)
	}
	return res
}

// refuse fails a message that never entered its key's queue. A keyed
// message pauses its key, as a failure after queueing does: otherwise a
// caller that does not wait on each result would see the key's later
// messages stored without it, and retrying it would store it out of order.
func (p *publisher) refuse(key string, err error) *PublishResult {
	if key != "" && keyrouter.ValidateOrderingKey(key) == nil {
		p.queues.pause(key, err)
	}
	return resolved("", err)
}

// sendBatch stores b's messages in order, retrying transient failures,
// then lets the key's next batch go. It is the keyQueues' send, run on its
// own goroutine.
func (p *publisher) sendBatch(b *batch) {
	items := b.items
	deadline := time.Now().Add(p.cfg.Timeout)
	backoff := 50 * time.Millisecond
	for len(items) > 0 {
		firstFail, errs := p.pipeline(items, deadline)
		if firstFail < 0 {
			p.complete(items, nil)
			break
		}
		p.complete(items[:firstFail], nil)
		items = items[firstFail:]
		err := errs[firstFail]
		suffix := true
		for _, e := range errs[firstFail:] {
			suffix = suffix && e != nil
		}
		if suffix && p.retryable(err, b.key() != "") && time.Now().Add(backoff).Before(deadline) {
			p.t.c.cfg.logger.Debug("publish failed; retrying in order", "topic", p.t.id, "key", b.key(), "messages", len(items), "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		p.fail(b, items, errs[firstFail:], p.t.publishError(err))
		return
	}
	p.queues.finish(b, nil)
}

// pipeline publishes batch asynchronously and waits for every ack. It
// returns the index of the first failure (-1 if none) and each message's
// error. A message that cannot be sent stops the batch there, so that
// send failures, like the server's refusals of a stream, form a suffix.
func (p *publisher) pipeline(batch []*pubItem, deadline time.Time) (int, []error) {
	futures := make([]jetstream.PubAckFuture, len(batch))
	errs := make([]error, len(batch))
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	window := p.t.c.publishWindow
	if err := window.Acquire(ctx, int64(len(batch))); err != nil {
		err = fmt.Errorf("no room among the client's in-flight messages within the publish timeout: %w", err)
		for i := range errs {
			errs[i] = err
		}
		return 0, errs
	}
	defer window.Release(int64(len(batch)))
	now := formatTime(time.Now())
	for i, it := range batch {
		writeSendTime(it.msg.Header, now)
		futures[i], errs[i] = p.t.c.js.PublishMsgAsync(it.msg, noLibraryRetry)
		if errs[i] != nil {
			for j := i + 1; j < len(batch); j++ {
				errs[j] = errs[i]
			}
			break
		}
	}
	first := -1
	for i, f := range futures {
		if f != nil {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				errs[i] = err
			}
		}
		if errs[i] != nil && first < 0 {
			first = i
		}
	}
	return first, errs
}

func (p *publisher) complete(items []*pubItem, err error) {
	for _, it := range items {
		p.flow.release(it.size)
		if err != nil {
			it.result.set("", err)
		} else {
			it.result.set(it.id, nil)
		}
	}
}

// fail ends a batch that cannot be stored in order: its messages from the
// first failure on (items, with their errors errs) fail, and for a keyed
// batch the key is paused, failing everything queued behind.
func (p *publisher) fail(b *batch, items []*pubItem, errs []error, cause error) {
	for i, it := range items {
		err := cause
		if errs[i] == nil && b.key() == "" {
			p.complete([]*pubItem{it}, nil) // unkeyed: no order to lose
			continue
		}
		if errs[i] == nil {
			// Stored, but after a message before it failed: its place in
			// the key's order is already lost, so it is reported as such.
			err = fmt.Errorf("stored out of order after an earlier message of its key failed: %w", cause)
		}
		p.complete([]*pubItem{it}, err)
	}
	p.queues.finish(b, cause)
}

// flush sends everything queued and waits until it is stored or failed.
func (p *publisher) flush() { p.queues.flush() }

// stop flushes and refuses later messages with ErrTopicStopped.
func (p *publisher) stop() { p.queues.stop() }

func (p *publisher) resume(key string) { p.queues.resume(key) }

// noLibraryRetry turns off nats.go's own re-send on "no responders": it
// re-sends each message from its own timer, in no particular order, which
// would store a key's messages out of order. The publisher retries instead.
var noLibraryRetry = jetstream.WithRetryAttempts(0)

// retryable reports whether a failed suffix of a batch may be sent again,
// in order, with the same message ids.
func (p *publisher) retryable(err error, keyed bool) bool {
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// No stream took the message: a stream leader election, or the
		// topic is gone.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, serr := p.t.c.js.Stream(ctx, p.t.stream)
		return !errors.Is(serr, jetstream.ErrStreamNotFound)
	case errors.Is(err, nats.ErrDisconnected):
		// The connection dropped with acks outstanding. The server may have
		// stored a later part of the batch (sent from the reconnect buffer)
		// but not an earlier part (lost with the socket), so a retry could
		// store a key's messages out of order: keyed batches pause instead.
		return !keyed
	}
	return transient(err)
}

// transient reports whether a publish error may go away by itself.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == 503
	}
	return false
}
