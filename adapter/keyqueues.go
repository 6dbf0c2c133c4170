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
// The keys waiting for DelayThreshold share one timer: they wait in a FIFO
// list, which is also their order of due times, since every key waits the
// same delay. With thousands of keys each batch is small, and a timer per
// batch showed in profiles.
//
// keyQueues does no I/O: it hands each batch to send and learns its end
// from finish, and it reads the time and waits through clock, so a test
// can drive it step by step. It is safe for concurrent use. flush and stop
// block until every queued batch has ended; the other methods do not block.
type keyQueues struct {
	cfg PublishSettings // the thresholds, defaults already applied
	// send starts a batch's I/O; whoever ends it calls finish. It is called
	// with mu held, so it must neither block nor call back into the queues.
	send func(*batch)
	// complete ends messages the queues fail themselves (those queued
	// behind a failure of their key): it sets their results and gives back
	// their flow control room. It is called with mu held, like send.
	complete func([]*pubItem, error)
	clock    clock

	mu      sync.Mutex
	seq     sequencer // sequence numbers follow queue order
	keys    map[string]*keyQueue
	stopped bool
	// messages counts those queued or in flight; flush waits for zero.
	messages int
	idle     *sync.Cond // signalled when messages falls to zero
	// hurrying counts Flush calls and flow-control-blocked Publish calls;
	// while any wait, batches go at once instead of after DelayThreshold.
	hurrying int
	// delayed lists, in the order they began to wait, the keys waiting for
	// DelayThreshold, and entries of keys that have gone since (stale: see
	// live).
	delayed []delayEntry
	// timer fires at the first waiting key's due time or earlier; nil when
	// none is armed. It is not stopped when the keys it waits for go
	// early: it then fires once for nothing, which is cheaper than a timer
	// per batch when every key's batch is small.
	timer    timer
	timerGen uint64 // numbers the timers armed, so fire knows its own
}

// clock is what the queues need of package time: a test brings its own.
type clock interface {
	Now() time.Time
	// AfterFunc runs f after d, as time.AfterFunc does.
	AfterFunc(d time.Duration, f func()) timer
}

// timer is what the queues need of a *time.Timer.
type timer interface {
	// Stop keeps the timer's func from running if it has not started.
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

type keyQueue struct {
	key      string
	pending  []*pubItem
	bytes    int
	inFlight bool
	paused   error // non-nil: the failure that paused the key
	// waiting: the key is in delayed, to go at due. wait numbers its
	// entries there, so an entry from an earlier wait is known stale.
	waiting bool
	due     time.Time
	wait    uint64
}

// delayEntry is a key's place in keyQueues.delayed.
type delayEntry struct {
	q    *keyQueue
	wait uint64
}

// live reports whether e is its key's current wait.
func (e delayEntry) live() bool { return e.q.waiting && e.q.wait == e.wait }

type pubItem struct {
	msg    *nats.Msg
	id     string
	size   int
	result PublishResult // in the item: one allocation fewer per message
}

// batch is the messages of one key sent together, in queue order.
type batch struct {
	q     *keyQueue
	items []*pubItem
}

func (b *batch) key() string { return b.q.key }

// newKeyQueues returns empty queues. cfg's thresholds must be positive;
// clock nil means package time.
func newKeyQueues(cfg PublishSettings, seq sequencer, send func(*batch), complete func([]*pubItem, error),
	clock clock) *keyQueues {
	if clock == nil {
		clock = realClock{}
	}
	k := &keyQueues{cfg: cfg, send: send, complete: complete, clock: clock,
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
	it := &pubItem{msg: msg, size: size}
	it.result.done = make(chan struct{})
	it.id = k.seq.stamp(msg.Header)
	q.pending = append(q.pending, it)
	q.bytes += size
	k.messages++
	k.schedule(q)
	return &it.result, nil
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

// schedule sends q's next batch if it is full, or lets it wait for the
// delay. Called with k.mu held.
func (k *keyQueues) schedule(q *keyQueue) {
	if q.inFlight || len(q.pending) == 0 {
		return
	}
	if len(q.pending) >= k.cfg.CountThreshold || q.bytes >= k.cfg.ByteThreshold || k.hurrying > 0 || k.stopped {
		k.sendLocked(q)
		return
	}
	if q.waiting {
		return
	}
	q.waiting = true
	q.due = k.clock.Now().Add(k.cfg.DelayThreshold)
	q.wait++
	k.delayed = append(k.delayed, delayEntry{q, q.wait})
	if k.timer == nil {
		k.armLocked(k.cfg.DelayThreshold)
	}
}

// armLocked arms the queues' timer to fire after d. Called with k.mu held.
func (k *keyQueues) armLocked(d time.Duration) {
	k.timerGen++
	gen := k.timerGen
	k.timer = k.clock.AfterFunc(d, func() { k.fire(gen) })
}

// fire sends the batches that are due and arms the timer for the next.
func (k *keyQueues) fire(gen uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.timer == nil || k.timerGen != gen {
		return // stopped while it waited for the lock
	}
	k.timer = nil
	now := k.clock.Now()
	i := 0
	for ; i < len(k.delayed); i++ {
		e := k.delayed[i]
		if !e.live() {
			continue
		}
		if e.q.due.After(now) {
			k.armLocked(e.q.due.Sub(now))
			break
		}
		k.sendLocked(e.q)
	}
	clear(k.delayed[:i]) // let forgotten queues be collected
	if i == len(k.delayed) {
		k.delayed = k.delayed[:0]
	} else {
		k.delayed = k.delayed[i:] // append copies the rest when it grows
	}
}

// hurry sends every waiting batch now, and makes later ones go at once
// until done is called.
func (k *keyQueues) hurry() (done func()) {
	k.mu.Lock()
	k.hurrying++
	k.sendDelayedLocked()
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.hurrying--
		k.mu.Unlock()
	}
}

// sendDelayedLocked sends every batch waiting for the delay. Called with
// k.mu held.
func (k *keyQueues) sendDelayedLocked() {
	for _, e := range k.delayed {
		if e.live() {
			k.sendLocked(e.q)
		}
	}
	clear(k.delayed)
	k.delayed = k.delayed[:0]
	// The timer stays armed: it fires for nothing, and spares the next
	// waiting key a timer of its own.
}

// sendLocked takes one batch off q and sends it. Called with k.mu held.
func (k *keyQueues) sendLocked(q *keyQueue) {
	q.waiting = false
	n, bytes := 0, 0
	for n < len(q.pending) && n < min(k.cfg.CountThreshold, publishWindowSize) && (n == 0 || bytes+q.pending[n].size <= k.cfg.ByteThreshold) {
		bytes += q.pending[n].size
		n++
	}
	// The batch shares q.pending's array: capped at n, it never sees what
	// is appended behind it.
	b := &batch{q: q, items: q.pending[:n:n]}
	if n == len(q.pending) {
		q.pending = nil
	} else {
		q.pending = q.pending[n:]
	}
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
	k.messages -= len(b.items)
	if cause != nil && q.key != "" {
		q.paused = fmt.Errorf("%w %q: %w", ErrPublishingPaused, q.key, cause)
		pending := q.pending
		q.pending, q.bytes = nil, 0
		k.messages -= len(pending)
		k.complete(pending, q.paused)
	} else {
		k.schedule(q)
	}
	k.drainedLocked(q)
}

// drainedLocked forgets an empty, unpaused queue and wakes flush once
// nothing is left.
func (k *keyQueues) drainedLocked(q *keyQueue) {
	if !q.inFlight && len(q.pending) == 0 && q.paused == nil {
		delete(k.keys, q.key)
	}
	if k.messages == 0 {
		k.idle.Broadcast()
	}
}

// flush sends everything queued and waits until it is stored or failed.
func (k *keyQueues) flush() {
	done := k.hurry()
	defer done()
	k.mu.Lock()
	defer k.mu.Unlock()
	for k.messages > 0 {
		k.idle.Wait()
	}
}

// stop refuses later messages with ErrTopicStopped, then flushes.
func (k *keyQueues) stop() {
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	k.flush()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.timer != nil { // nothing waits for it now
		k.timer.Stop()
		k.timer = nil
	}
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
