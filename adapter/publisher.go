package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// each key's batches one at a time, in Publish order. The batches that are
// ready, of any keys, go out together in one pipelined run (asynchronous
// publish on one connection, which the server stores in order), from one
// goroutine, and one more awaits their acks in send order: with thousands
// of keys each batch is small, and a goroutine and a wait per batch showed
// in profiles. A key's next batch goes only once its last has ended.
//
// A batch whose failures form a suffix (every message after the first
// failure failed too) is retried from the first failure, still in order,
// with the same message ids, so JetStream's de-duplication stores each
// message once; the retry has a goroutine of its own, so that other keys'
// acks are not held up. Any other failure pattern, or a permanent
// error, pauses the key.
//
// The publisher does the I/O; its keyQueues decide when each batch goes.
type publisher struct {
	t      *Topic
	cfg    PublishSettings
	queues *keyQueues
	flow   *flowController

	mu      sync.Mutex
	toSend  []*batch     // let go by the queues, not sent yet
	sending bool         // sendLoop runs
	sent    []*sentBatch // on the wire, acks not awaited yet, in send order
	acking  bool         // ackLoop runs
}

// sentBatch is one attempt at sending a batch's messages (items, a suffix
// of the batch on a retry).
type sentBatch struct {
	b        *batch
	items    []*pubItem
	futures  []jetstream.PubAckFuture
	errs     []error // per item; nil while none has failed
	deadline time.Time
	window   int64 // room taken in the client's window of in-flight messages
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
		p.send, p.complete, nil)
	return p
}

// resolved is a result known at once (a message refused before queueing).
func resolved(id string, err error) *PublishResult {
	r := &PublishResult{done: make(chan struct{})}
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
		p.flow.release(1, size)
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

// send takes a batch the queues let go. It is the keyQueues' send: it
// does not block.
func (p *publisher) send(b *batch) {
	p.mu.Lock()
	p.toSend = append(p.toSend, b)
	start := !p.sending
	p.sending = true
	p.mu.Unlock()
	if start {
		go p.sendLoop()
	}
}

// sendLoop sends the batches the queues let go, all that are waiting in
// one run, and hands each to ackLoop as soon as it is sent, so that acks
// make room in the client's window while a long run waits for it. It
// returns when no batch is left.
func (p *publisher) sendLoop() {
	var batches []*batch
	for {
		p.mu.Lock()
		batches, p.toSend = p.toSend, batches[:0]
		if len(batches) == 0 {
			p.sending = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		now := time.Now()
		sent, deadline := sendTime(now), now.Add(p.cfg.Timeout)
		for i, b := range batches {
			s := p.publish(b.items, &sent, deadline)
			s.b = b
			batches[i] = nil
			p.mu.Lock()
			p.sent = append(p.sent, s)
			start := !p.acking
			p.acking = true
			p.mu.Unlock()
			if start {
				go p.ackLoop()
			}
		}
	}
}

// ackLoop awaits the acks of the batches sendLoop sent, in send order, and
// ends each. It returns when none is left.
func (p *publisher) ackLoop() {
	var sent []*sentBatch
	for {
		p.mu.Lock()
		sent, p.sent = p.sent, sent[:0]
		if len(sent) == 0 {
			p.acking = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		firsts := make([]int, len(sent))
		for i, s := range sent {
			firsts[i] = s.await()
			p.t.c.publishWindow.Release(s.window)
		}
		// One sync for every batch of the run: group commit.
		durableErr := p.durable()
		for i, s := range sent {
			first := firsts[i]
			switch {
			case durableErr != nil:
				p.fail(s.b, s.items, repeatErr(durableErr, len(s.items)), durableErr)
			case first < 0:
				p.complete(s.items, nil)
				p.queues.finish(s.b, nil)
			default:
				p.complete(s.items[:first], nil)
				go p.retry(s.b, s.items[first:], s.errs[first:], s.deadline)
			}
			sent[i] = nil
		}
	}
}

// durable waits until what the server acknowledged so far is on stable
// storage, when the client was given a way to know (WithDurableSync). Its
// error fails the messages it covers: they are stored, but nobody can
// promise they survive a power cut.
func (p *publisher) durable() error {
	sync := p.t.c.cfg.durable
	if sync == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	if err := sync(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return nil
}

func repeatErr(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// retry ends a batch whose messages items failed with errs, in order: a
// suffix of failures that may go away is sent again (with the same
// message ids) until it is stored or the deadline is near; anything else
// fails the batch and pauses its key.
func (p *publisher) retry(b *batch, items []*pubItem, errs []error, deadline time.Time) {
	backoff := 50 * time.Millisecond
	for {
		err := errs[0]
		suffix := true
		for _, e := range errs {
			suffix = suffix && e != nil
		}
		if !suffix || !p.retryable(err, b.key() != "") || !time.Now().Add(backoff).Before(deadline) {
			p.fail(b, items, errs, p.t.publishError(err))
			return
		}
		p.t.c.cfg.logger.Debug("publish failed; retrying in order", "topic", p.t.id, "key", b.key(), "messages", len(items), "err", err)
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
		sent := sendTime(time.Now())
		s := p.publish(items, &sent, deadline)
		first := s.await()
		p.t.c.publishWindow.Release(s.window)
		if err := p.durable(); err != nil {
			p.fail(b, items, repeatErr(err, len(items)), err)
			return
		}
		if first < 0 {
			p.complete(items, nil)
			break
		}
		p.complete(items[:first], nil)
		items, errs = items[first:], s.errs[first:]
	}
	p.queues.finish(b, nil)
}

// publish sends items asynchronously, in order, once it has room for all
// of them in the client's window; it does not wait for acks. It stamps
// them with sent, the run's send time, and takes the time anew if it had
// to wait. A message that cannot be sent stops the run there, so that
// send failures, like the server's refusals of a stream, form a suffix.
func (p *publisher) publish(items []*pubItem, sent *[]string, deadline time.Time) *sentBatch {
	s := &sentBatch{items: items, deadline: deadline}
	if !p.t.c.layoutOK.Load() {
		// The client's first write may be this one: the account's layout
		// is checked first (Client.ensureLayout), here rather than in
		// Publish, which does not wait for the network.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := p.t.c.ensureLayout(ctx)
		cancel()
		if err != nil {
			s.failFrom(0, err)
			return s
		}
		*sent = sendTime(time.Now())
	}
	n := int64(len(items))
	if window := p.t.c.publishWindow; !window.TryAcquire(n) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := window.Acquire(ctx, n)
		cancel()
		if err != nil {
			s.failFrom(0, fmt.Errorf("no room among the client's in-flight messages within the publish timeout: %w", err))
			return s
		}
		*sent = sendTime(time.Now())
	}
	s.window = n
	s.futures = make([]jetstream.PubAckFuture, len(items))
	for i, it := range items {
		writeSendTime(it.msg.Header, *sent)
		f, err := p.t.c.js.PublishMsgAsync(it.msg, noLibraryRetry)
		if err != nil {
			s.failFrom(i, err)
			break
		}
		s.futures[i] = f
	}
	return s
}

// failFrom fails the messages from i on with err.
func (s *sentBatch) failFrom(i int, err error) {
	if s.errs == nil {
		s.errs = make([]error, len(s.items))
	}
	for ; i < len(s.errs); i++ {
		s.errs[i] = err
	}
}

// await waits for every ack and returns the index of the first failure, or
// -1 if none; s.errs holds each message's error.
func (s *sentBatch) await() int {
	for i, f := range s.futures {
		if f == nil {
			continue // not sent
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if s.errs == nil {
				s.errs = make([]error, len(s.items))
			}
			s.errs[i] = err
		}
	}
	for i, err := range s.errs {
		if err != nil {
			return i
		}
	}
	return -1
}

func (p *publisher) complete(items []*pubItem, err error) {
	bytes := 0
	for _, it := range items {
		bytes += it.size
	}
	p.flow.release(len(items), bytes)
	for _, it := range items {
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

// transient reports whether an error of a publish or an API request may
// go away by itself (a cluster electing a leader, a reconnect).
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
