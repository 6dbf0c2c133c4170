package adapter

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// keyQueues is the publisher's scheduler: one queue per ordering key (and
// one for the unkeyed messages, key ""), cut into batches by
// CountThreshold, ByteThreshold and DelayThreshold, with at most one batch
// of a key in flight, so that a key's batches are stored in queue order.
// A key whose batch failed is paused, keeping the failure, until resume.
//
// keyQueues does no I/O: it hands each batch to send and learns its end
// from finish, and it waits through afterFunc, so a test can drive it step
// by step. It is safe for concurrent use. flush and stop block until every
// queued batch has ended; the other methods do not block.
type keyQueues struct {
	cfg PublishSettings // the thresholds, defaults already applied
	// send starts a batch's I/O; whoever ends it calls finish. It is called
	// with mu held, so it must neither block nor call back into the queues.
	send func(*batch)
	// complete ends messages the queues fail themselves (those queued
	// behind a failure of their key): it sets their results and gives back
	// their flow control room. It is called with mu held, like send.
	complete func([]*pubItem, error)
	// afterFunc runs f after d, as time.AfterFunc does.
	afterFunc func(d time.Duration, f func()) timer

	mu      sync.Mutex
	seq     sequencer // sequence numbers follow queue order
	keys    map[string]*keyQueue
	stopped bool
	idle    *sync.Cond // signalled when a key queue drains
	// hurrying counts Flush calls and flow-control-blocked Publish calls;
	// while any wait, batches go at once instead of after DelayThreshold.
	hurrying int
}

// timer is what the queues need of a *time.Timer: a test fires its own.
type timer interface {
	// Stop keeps the timer's func from running if it has not started.
	Stop() bool
}

func realAfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

type keyQueue struct {
	key      string
	pending  []*pubItem
	bytes    int
	inFlight bool
	paused   error // non-nil: the failure that paused the key
	timer    timer
}

type pubItem struct {
	msg    *nats.Msg
	id     string
	size   int
	result *PublishResult
}

// batch is the messages of one key sent together, in queue order.
type batch struct {
	q     *keyQueue
	items []*pubItem
}

func (b *batch) key() string { return b.q.key }

// newKeyQueues returns empty queues. cfg's thresholds must be positive;
// afterFunc nil means time.AfterFunc.
func newKeyQueues(cfg PublishSettings, seq sequencer, send func(*batch), complete func([]*pubItem, error),
	afterFunc func(time.Duration, func()) timer) *keyQueues {
	if afterFunc == nil {
		afterFunc = realAfterFunc
	}
	k := &keyQueues{cfg: cfg, send: send, complete: complete, afterFunc: afterFunc,
		seq: seq, keys: map[string]*keyQueue{}}
	k.idle = sync.NewCond(&k.mu)
	return k
}

// add stamps msg with the next sequence number and its message id and
// queues it behind key's earlier messages. size is what it counts against
// ByteThreshold. It refuses the message with ErrTopicStopped after stop,
// or with the key's pause (wrapping ErrPublishingPaused); msg is untouched
// then.
func (k *keyQueues) add(key string, msg *nats.Msg, size int) (*PublishResult, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return nil, ErrTopicStopped
	}
	q := k.queue(key)
	if q.paused != nil {
		return nil, q.paused
	}
	sender, seq := k.seq.take()
	id := writeIdentity(msg.Header, sender, seq)
	res := newResult()
	q.pending = append(q.pending, &pubItem{msg: msg, id: id, size: size, result: res})
	q.bytes += size
	k.schedule(q)
	return res, nil
}

// queue returns key's queue, creating it. Called with k.mu held.
func (k *keyQueues) queue(key string) *keyQueue {
	q := k.keys[key]
	if q == nil {
		q = &keyQueue{key: key}
		k.keys[key] = q
	}
	return q
}

// pause pauses key because one of its messages failed with err before it
// was queued, unless the key is paused already. What is queued before it
// still goes: it precedes the failed message.
func (k *keyQueues) pause(key string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if q := k.queue(key); q.paused == nil {
		q.paused = fmt.Errorf("%w %q: %w", ErrPublishingPaused, key, err)
	}
}

// schedule sends q's next batch if it is full, or arms the delay timer.
// Called with k.mu held.
func (k *keyQueues) schedule(q *keyQueue) {
	if q.inFlight || len(q.pending) == 0 {
		return
	}
	if len(q.pending) >= k.cfg.CountThreshold || q.bytes >= k.cfg.ByteThreshold || k.hurrying > 0 || k.stopped {
		k.sendLocked(q)
		return
	}
	if q.timer == nil {
		var t timer
		t = k.afterFunc(k.cfg.DelayThreshold, func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			if q.timer != t {
				return // the batch went without waiting for this timer
			}
			q.timer = nil
			if !q.inFlight && len(q.pending) > 0 {
				k.sendLocked(q)
			}
		})
		q.timer = t // before the callback can run: the caller holds k.mu
	}
}

// hurry sends every waiting batch now, and makes later ones go at once
// until done is called.
func (k *keyQueues) hurry() (done func()) {
	k.mu.Lock()
	k.hurrying++
	for _, q := range k.keys {
		if !q.inFlight && len(q.pending) > 0 {
			k.sendLocked(q)
		}
	}
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.hurrying--
		k.mu.Unlock()
	}
}

// sendLocked takes one batch off q and sends it. Called with k.mu held.
func (k *keyQueues) sendLocked(q *keyQueue) {
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	n, bytes := 0, 0
	for n < len(q.pending) && n < min(k.cfg.CountThreshold, publishWindowSize) && (n == 0 || bytes+q.pending[n].size <= k.cfg.ByteThreshold) {
		bytes += q.pending[n].size
		n++
	}
	b := &batch{q: q, items: append([]*pubItem(nil), q.pending[:n]...)}
	q.pending = q.pending[n:]
	q.bytes -= bytes
	q.inFlight = true
	k.send(b)
}

// finish ends b, whose messages' results are set, and lets its key's next
// batch go. A non-nil cause is why b could not be stored in order: it
// pauses a keyed batch's key and fails everything queued behind it.
func (k *keyQueues) finish(b *batch, cause error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	q := b.q
	q.inFlight = false
	if cause != nil && q.key != "" {
		q.paused = fmt.Errorf("%w %q: %w", ErrPublishingPaused, q.key, cause)
		pending := q.pending
		q.pending, q.bytes = nil, 0
		for _, it := range pending {
			k.complete([]*pubItem{it}, q.paused)
		}
	} else {
		k.schedule(q)
	}
	k.drainedLocked(q)
}

// drainedLocked forgets an empty, unpaused queue and wakes flush.
func (k *keyQueues) drainedLocked(q *keyQueue) {
	if !q.inFlight && len(q.pending) == 0 {
		if q.paused == nil {
			delete(k.keys, q.key)
		}
		k.idle.Broadcast()
	}
}

// flush sends everything queued and waits until it is stored or failed.
func (k *keyQueues) flush() {
	done := k.hurry()
	defer done()
	k.mu.Lock()
	defer k.mu.Unlock()
	for k.busyLocked() {
		k.idle.Wait()
	}
}

// stop refuses later messages with ErrTopicStopped, then flushes.
func (k *keyQueues) stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.flush()
}

func (k *keyQueues) busyLocked() bool {
	for _, q := range k.keys {
		if q.inFlight || len(q.pending) > 0 {
			return true
		}
	}
	return false
}

// resume lets a paused key take messages again.
func (k *keyQueues) resume(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if q := k.keys[key]; q != nil && q.paused != nil {
		q.paused = nil
		k.drainedLocked(q)
	}
}
