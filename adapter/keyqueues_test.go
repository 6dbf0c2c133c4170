package adapter

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/rsb"
)

// fakeClock is the keyQueues' clock for tests: its timers fire only when
// the test advances it, on the test's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Duration
	f    func()
	done bool // fired or stopped
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Unix(0, 0).Add(c.now)
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now + d, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	return true
}

// due moves the clock d on and returns the funcs of the timers that fire,
// in firing order, without running them: they count as started, so Stop
// no longer stops them (a time.Timer whose func waits for a lock).
func (c *fakeClock) due(d time.Duration) []func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	slices.SortStableFunc(c.timers, func(a, b *fakeTimer) int { return int(a.at - b.at) })
	var fs []func()
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.done:
		case t.at <= c.now:
			t.done = true
			fs = append(fs, t.f)
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
	return fs
}

func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

var queuesTestSender = uuid.MustParse("D8FBFEF4-4EB0-4C89-9716-C425DED3C527")

// queuesHarness drives a keyQueues: it stands in for the publisher's I/O,
// names each message by its key and its index among the key's accepted
// messages ("a0", "a1", ...; "_0" for unkeyed ones), and checks on every
// send that a key has one batch in flight and sends its messages in
// order.
type queuesHarness struct {
	t     *testing.T
	clock *fakeClock
	k     *keyQueues

	mu        sync.Mutex          // guards the fields the callbacks write
	sent      []string            // batches sent since the last step
	inFlight  map[string][]*batch // per key, sent and not finished
	lastSent  map[string]int      // per key, the index of its last message sent
	abandoned int                 // bytes of the messages the queues failed

	next    map[string]int // per key, the index of the next accepted message
	msgs    map[string]*nats.Msg
	results map[string]*PublishResult
	hurries []func()
	flushes []chan struct{} // one per flush or stop called; closed when it returns
}

func newQueuesHarness(t *testing.T, cfg PublishSettings) *queuesHarness {
	h := &queuesHarness{t: t, clock: &fakeClock{}, inFlight: map[string][]*batch{}, lastSent: map[string]int{},
		next: map[string]int{}, msgs: map[string]*nats.Msg{}, results: map[string]*PublishResult{}}
	h.k = newKeyQueues(cfg, sequencer{sender: queuesTestSender, next: cfg.FirstSequence}, h.send, h.complete, h.clock)
	return h
}

func msgLabel(key string, i int) string {
	if key == "" {
		key = "_"
	}
	return key + strconv.Itoa(i)
}

func msgLabelIndex(l string) int {
	i, _ := strconv.Atoi(l[1:])
	return i
}

// send is the keyQueues' send; it runs with the queues' lock held.
func (h *queuesHarness) send(b *batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key := b.key()
	var labels []string
	for _, it := range b.items {
		l := string(it.msg.Data)
		select {
		case <-it.result.Ready():
			h.t.Errorf("%s sent after its result: %v", l, it.result.err)
		default:
		}
		if last, ok := h.lastSent[key]; ok && msgLabelIndex(l) <= last {
			h.t.Errorf("key %q: %s sent after %s", key, l, msgLabel(key, last))
		}
		h.lastSent[key] = msgLabelIndex(l)
		labels = append(labels, l)
	}
	if len(h.inFlight[key]) > 0 {
		h.t.Errorf("key %q: batch [%s] sent while another is in flight", key, strings.Join(labels, " "))
	}
	h.inFlight[key] = append(h.inFlight[key], b)
	h.sent = append(h.sent, strings.Join(labels, " "))
}

// complete is the keyQueues' complete, as the publisher's: it sets the
// results of messages the queues fail.
func (h *queuesHarness) complete(items []*pubItem, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, it := range items {
		if !errors.Is(err, ErrPublishingPaused) {
			h.t.Errorf("%s failed by the queues with %v, want ErrPublishingPaused", it.msg.Data, err)
		}
		h.abandoned += it.size
		it.result.set("", err)
	}
}

func (h *queuesHarness) takeSent() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sent
	h.sent = nil
	slices.Sort(s) // keys sent in one step go in map order
	return s
}

// end finishes key's batch in flight, as the publisher does once it is
// stored (cause nil) or has failed.
func (h *queuesHarness) end(key string, cause error) {
	h.mu.Lock()
	if len(h.inFlight[key]) == 0 {
		h.mu.Unlock()
		h.t.Fatalf("key %q has no batch in flight", key)
	}
	b := h.inFlight[key][0]
	h.inFlight[key] = h.inFlight[key][1:]
	h.mu.Unlock()
	for _, it := range b.items {
		select {
		case <-it.result.Ready():
			continue // send reported it
		default:
		}
		if cause == nil {
			it.result.set(it.id, nil)
		} else {
			it.result.set("", cause)
		}
	}
	h.k.finish(b, cause)
}

// qa makes the actions of TestKeyQueues' steps (do.pub("a"), ...).
type qa struct{}

// queuesAction is one thing a test does to the queues.
type queuesAction struct {
	name string
	run  func(h *queuesHarness)
}

func (qa) pubSize(key string, size int) queuesAction {
	return queuesAction{fmt.Sprintf("publish %q (%d bytes)", key, size), func(h *queuesHarness) {
		l := msgLabel(key, h.next[key])
		msg := nats.NewMsg("subject")
		msg.Data = []byte(l)
		res, err := h.k.add(key, msg, size)
		if err != nil {
			h.t.Fatalf("%s refused: %v", l, err)
		}
		h.next[key]++
		h.msgs[l], h.results[l] = msg, res
	}}
}

func (qa) pub(key string) queuesAction { return qa{}.pubSize(key, 10) }

func (qa) pubN(key string, n int) queuesAction {
	return queuesAction{fmt.Sprintf("publish %d %q", n, key), func(h *queuesHarness) {
		for range n {
			qa{}.pub(key).run(h)
		}
	}}
}

// refused publishes a message of key that must be refused with an error
// matching each of wants. It takes no index.
func (qa) refused(key string, wants ...error) queuesAction {
	return queuesAction{fmt.Sprintf("publish %q, refused", key), func(h *queuesHarness) {
		msg := nats.NewMsg("subject")
		msg.Data = []byte("refused")
		res, err := h.k.add(key, msg, 10)
		if res != nil || err == nil {
			h.t.Fatalf("message of %q accepted", key)
		}
		for _, w := range wants {
			if !errors.Is(err, w) {
				h.t.Errorf("refused with %v, want %v", err, w)
			}
		}
		if len(msg.Header) != 0 {
			h.t.Errorf("refused message stamped: %v", msg.Header)
		}
	}}
}

func (qa) advance(d time.Duration) queuesAction {
	return queuesAction{"advance " + d.String(), func(h *queuesHarness) {
		for _, f := range h.clock.due(d) {
			f()
		}
	}}
}

// late moves the clock d on, then runs inner before the timers that fired
// get the queues' lock.
func (qa) late(d time.Duration, inner ...queuesAction) queuesAction {
	return queuesAction{"timers due after " + d.String() + " run late", func(h *queuesHarness) {
		fs := h.clock.due(d)
		for _, a := range inner {
			a.run(h)
		}
		for _, f := range fs {
			f()
		}
	}}
}

func (qa) done(key string) queuesAction {
	return queuesAction{fmt.Sprintf("batch of %q stored", key), func(h *queuesHarness) { h.end(key, nil) }}
}

func (qa) fail(key string, cause error) queuesAction {
	return queuesAction{fmt.Sprintf("batch of %q failed", key), func(h *queuesHarness) { h.end(key, cause) }}
}

func (qa) pause(key string, err error) queuesAction {
	return queuesAction{fmt.Sprintf("pause %q", key), func(h *queuesHarness) { h.k.pause(key, err) }}
}

func (qa) resume(key string) queuesAction {
	return queuesAction{fmt.Sprintf("resume %q", key), func(h *queuesHarness) { h.k.resume(key) }}
}

func (qa) hurry() queuesAction {
	return queuesAction{"hurry", func(h *queuesHarness) { h.hurries = append(h.hurries, h.k.hurry()) }}
}

func (qa) hurryDone() queuesAction {
	return queuesAction{"hurry done", func(h *queuesHarness) {
		h.hurries[0]()
		h.hurries = h.hurries[1:]
	}}
}

// flush and stop start a call that blocks until the queues drain.
func (qa) flush() queuesAction { return qa{}.blocking("flush", func(k *keyQueues) { k.flush() }) }
func (qa) stop() queuesAction  { return qa{}.blocking("stop", func(k *keyQueues) { k.stop() }) }

func (qa) blocking(name string, f func(*keyQueues)) queuesAction {
	return queuesAction{name, func(h *queuesHarness) {
		ch := make(chan struct{})
		h.flushes = append(h.flushes, ch)
		go func() {
			f(h.k)
			close(ch)
		}()
	}}
}

// waiting checks how many flush and stop calls have not returned.
func (qa) waiting(n int) queuesAction {
	return queuesAction{fmt.Sprintf("%d flush or stop waiting", n), func(h *queuesHarness) {
		got := 0
		for _, ch := range h.flushes {
			select {
			case <-ch:
			default:
				got++
			}
		}
		if got != n {
			h.t.Errorf("%d flush or stop calls waiting, want %d", got, n)
		}
	}}
}

// delayed checks how many keys wait for the delay, and that they share one
// timer.
func (qa) delayed(n int) queuesAction {
	return queuesAction{fmt.Sprintf("%d keys wait for the delay", n), func(h *queuesHarness) {
		h.k.mu.Lock()
		got := 0
		for _, e := range h.k.delayed {
			if e.live() {
				got++
			}
		}
		h.k.mu.Unlock()
		if got != n {
			h.t.Errorf("%d keys wait for the delay, want %d", got, n)
		}
		if armed := h.clock.armed(); armed > 1 || n > 0 && armed == 0 {
			h.t.Errorf("%d timers armed for %d keys waiting, want one", armed, n)
		}
	}}
}

// queues checks how many key queues the queues remember.
func (qa) queues(n int) queuesAction {
	return queuesAction{fmt.Sprintf("%d queues", n), func(h *queuesHarness) {
		h.k.mu.Lock()
		got := len(h.k.keys)
		h.k.mu.Unlock()
		if got != n {
			h.t.Errorf("%d key queues, want %d", got, n)
		}
	}}
}

func (qa) abandoned(bytes int) queuesAction {
	return queuesAction{fmt.Sprintf("%d bytes given back", bytes), func(h *queuesHarness) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.abandoned != bytes {
			h.t.Errorf("the queues gave back %d bytes of the messages they failed, want %d", h.abandoned, bytes)
		}
	}}
}

// errNoResultYet in results means: no result yet.
var errNoResultYet = errors.New("no result yet")

// results checks messages' results: nil is stored with its message id,
// errNoResultYet not known yet; any other error must match.
func (qa) results(want map[string]error) queuesAction {
	return queuesAction{"results", func(h *queuesHarness) {
		for l, w := range want {
			r := h.results[l]
			if r == nil {
				h.t.Fatalf("no message %s", l)
			}
			select {
			case <-r.Ready():
			default:
				if w != errNoResultYet {
					h.t.Errorf("%s: no result yet, want %v", l, w)
				}
				continue
			}
			switch {
			case w == errNoResultYet:
				h.t.Errorf("%s: result (%q, %v), want none yet", l, r.id, r.err)
			case w == nil && (r.err != nil || r.id != h.msgs[l].Header.Get(headerNatsMsgID)):
				h.t.Errorf("%s: result (%q, %v), want its message id", l, r.id, r.err)
			case w != nil && !errors.Is(r.err, w):
				h.t.Errorf("%s: result error %v, want %v", l, r.err, w)
			}
		}
	}}
}

// sequence checks that the messages, named in the order they were
// published, carry consecutive sequence numbers from first and the message
// ids those make.
func (qa) sequence(first uint32, labels ...string) queuesAction {
	return queuesAction{"sequence numbers", func(h *queuesHarness) {
		for i, l := range labels {
			seq := first + uint32(i)
			hd := h.msgs[l].Header
			if got := hd.Get(headerSequence); got != strconv.FormatUint(uint64(seq), 10) {
				h.t.Errorf("%s: sequence %s, want %d", l, got, seq)
			}
			if got := hd.Get(headerNatsMsgID); got != rsb.MessageID(queuesTestSender, seq) {
				h.t.Errorf("%s: message id %s, want %s", l, got, rsb.MessageID(queuesTestSender, seq))
			}
		}
	}}
}

// kqStep is an action and the batches it must send: each batch is its
// messages' names, in order, space-separated.
type kqStep struct {
	do    queuesAction
	sends []string
}

func kq(do queuesAction, sends ...string) kqStep { return kqStep{do, sends} }

// batchOf names key's messages from to to-1 as one batch.
func batchOf(key string, from, to int) string {
	var s []string
	for i := from; i < to; i++ {
		s = append(s, msgLabel(key, i))
	}
	return strings.Join(s, " ")
}

// TestKeyQueues drives the publisher's scheduler one step at a time, with
// no server and a fake clock: each step must send exactly its batches.
// Throughout, the harness checks that a key has one batch in flight, sends
// its messages in publish order, and never sends a message whose result is
// known.
func TestKeyQueues(t *testing.T) {
	const delay = 10 * time.Millisecond
	cfg := func(count, bytes int) PublishSettings {
		return PublishSettings{CountThreshold: count, ByteThreshold: bytes, DelayThreshold: delay}
	}
	errServer := errors.New("server refused")
	errRefused := errors.New("refused before queueing")
	errLater := errors.New("a later refusal")
	var do qa
	tests := []struct {
		name  string
		cfg   PublishSettings
		steps []kqStep
	}{
		{"a batch goes at the count threshold", cfg(3, 1000), []kqStep{
			kq(do.pub("a")),
			kq(do.pub("a")),
			kq(do.pub("a"), "a0 a1 a2"),
			kq(do.delayed(0)),
			kq(do.advance(delay)),
			kq(do.done("a")),
			kq(do.results(map[string]error{"a0": nil, "a1": nil, "a2": nil})),
		}},
		{"a batch goes at the byte threshold and holds no more", cfg(100, 25), []kqStep{
			kq(do.pub("a")),
			kq(do.pub("a")),
			kq(do.pub("a"), "a0 a1"), // 30 bytes waiting; a batch holds 25
			kq(do.done("a")),         // a2's 10 bytes wait for the delay
			kq(do.delayed(1)),
			kq(do.advance(delay), "a2"),
			kq(do.done("a")),
		}},
		{"exactly the byte threshold is enough", cfg(100, 20), []kqStep{
			kq(do.pub("a")),
			kq(do.pub("a"), "a0 a1"),
			kq(do.done("a")),
		}},
		{"a message over the byte threshold goes alone", cfg(100, 25), []kqStep{
			kq(do.pubSize("a", 100), "a0"),
			kq(do.pub("b")),
			kq(do.pubSize("b", 100), "b0"),
			kq(do.done("b"), "b1"),
			kq(do.done("a")),
			kq(do.done("b")),
		}},
		{"a batch holds at most the client's publish window", cfg(publishWindowSize+1000, 1<<40), []kqStep{
			kq(do.pubN("a", publishWindowSize+1000), batchOf("a", 0, publishWindowSize)),
			kq(do.done("a")), // the rest is under the count threshold
			kq(do.advance(delay), batchOf("a", publishWindowSize, publishWindowSize+1000)),
			kq(do.done("a")),
		}},
		{"the delay runs from the first message waiting", cfg(100, 1000), []kqStep{
			kq(do.pub("a")),
			kq(do.advance(delay / 2)),
			kq(do.pub("a")),
			kq(do.advance(delay/2 - time.Millisecond)),
			kq(do.advance(time.Millisecond), "a0 a1"),
			kq(do.pub("a")), // behind a batch in flight: no timer yet
			kq(do.delayed(0)),
			kq(do.done("a")),
			kq(do.delayed(1)),
			kq(do.advance(delay), "a2"),
			kq(do.done("a")),
		}},
		{"waiting keys share one timer; each goes at its own due time", cfg(100, 1000), []kqStep{
			kq(do.pub("a")),
			kq(do.advance(delay / 2)),
			kq(do.pub("b")),
			kq(do.pub("a")),
			kq(do.delayed(2)),
			kq(do.advance(delay/2), "a0 a1"),
			kq(do.delayed(1)),
			kq(do.advance(delay/2 - time.Millisecond)),
			kq(do.advance(time.Millisecond), "b0"),
			kq(do.delayed(0)),
			kq(do.done("a")),
			kq(do.done("b")),
		}},
		{"a timer left armed by a batch that went early sends nothing before its due time", cfg(100, 1000), []kqStep{
			kq(do.pub("a")),
			kq(do.hurry(), "a0"),
			kq(do.hurryDone()),
			kq(do.advance(delay / 2)),
			kq(do.done("a")),
			kq(do.pub("a")), // due at 1.5 delays; the timer fires at 1
			kq(do.advance(delay / 2)),
			kq(do.delayed(1)),
			kq(do.advance(delay/2), "a1"),
			kq(do.done("a")),
		}},
		{"a timer that fires after its batch went sends nothing", cfg(2, 1000), []kqStep{
			kq(do.pub("a")),
			// a1 sends a0 while its timer waits for the lock; a2 then
			// waits for a new timer, not for that one.
			kq(do.late(delay, do.pub("a"), do.pub("a"), do.done("a")), "a0 a1"),
			kq(do.delayed(1)),
			kq(do.advance(delay), "a2"),
			kq(do.done("a")),
		}},
		{"a key has one batch in flight; other keys and unkeyed messages go meanwhile", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pub("a")),
			kq(do.pub("a")),
			kq(do.pub("b"), "b0"),
			kq(do.pub(""), "_0"),
			kq(do.pub("")),
			kq(do.done("a"), "a1"),
			kq(do.done(""), "_1"),
			kq(do.results(map[string]error{"a0": nil, "a1": errNoResultYet, "a2": errNoResultYet, "_0": nil})),
			kq(do.done("a"), "a2"),
			kq(do.done("a")),
			kq(do.done("b")),
			kq(do.done("")),
			kq(do.queues(0)),
		}},
		{"a failure pauses its key until resume", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pub("a")),
			kq(do.pubSize("a", 7)),
			kq(do.pub("b"), "b0"),
			kq(do.fail("a", errServer)),
			kq(do.results(map[string]error{"a0": errServer, "a1": ErrPublishingPaused, "a2": ErrPublishingPaused, "b0": errNoResultYet})),
			kq(do.results(map[string]error{"a1": errServer})), // the pause keeps its cause
			kq(do.abandoned(17)),
			kq(do.refused("a", ErrPublishingPaused, errServer)),
			kq(do.refused("a", ErrPublishingPaused)),
			kq(do.pub("b")),
			kq(do.done("b"), "b1"),
			kq(do.done("b")),
			kq(do.resume("a")),
			kq(do.pub("a"), "a3"),
			kq(do.done("a")),
			kq(do.results(map[string]error{"a3": nil, "b1": nil})),
		}},
		{"unkeyed messages never pause", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.fail("a", errServer)),
			kq(do.pub(""), "_0"),
			kq(do.pub("")),
			kq(do.fail("", errServer), "_1"),
			kq(do.results(map[string]error{"_0": errServer, "_1": errNoResultYet})),
			kq(do.pub("")),
			kq(do.done(""), "_2"),
			kq(do.done("")),
			kq(do.results(map[string]error{"_1": nil, "_2": nil})),
			kq(do.queues(1)), // only the paused key
		}},
		{"a refusal pauses its key; what was queued before it still goes", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pub("a")),
			kq(do.pause("a", errRefused)),
			kq(do.refused("a", ErrPublishingPaused, errRefused)),
			kq(do.done("a"), "a1"),
			kq(do.done("a")),
			kq(do.results(map[string]error{"a0": nil, "a1": nil})),
			kq(do.refused("a", ErrPublishingPaused)),
			kq(do.resume("a")),
			kq(do.pub("a"), "a2"),
			kq(do.done("a")),
		}},
		{"a pause keeps the first refusal", cfg(1, 1000), []kqStep{
			kq(do.pause("a", errRefused)),
			kq(do.pause("a", errLater)),
			kq(do.refused("a", errRefused)),
			kq(queuesAction{"not the later refusal", func(h *queuesHarness) {
				if _, err := h.k.add("a", nats.NewMsg("subject"), 10); errors.Is(err, errLater) {
					h.t.Errorf("refused with %v, the later refusal", err)
				}
			}}),
		}},
		{"a failed batch's cause replaces a refusal queued after it", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pause("a", errRefused)),
			kq(do.fail("a", errServer)), // a0 came first in the key's order
			kq(do.refused("a", ErrPublishingPaused, errServer)),
		}},
		{"resume leaves a batch in flight alone", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pause("a", errRefused)),
			kq(do.resume("a")),
			kq(do.pub("a")),
			kq(do.done("a"), "a1"),
			kq(do.done("a")),
			kq(do.resume("b")), // not paused: nothing to do
			kq(do.queues(0)),
		}},
		{"queues are forgotten once idle, unless paused", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.queues(1)),
			kq(do.done("a")),
			kq(do.queues(0)),
			kq(do.pause("b", errRefused)),
			kq(do.queues(1)),
			kq(do.resume("b")),
			kq(do.queues(0)),
		}},
		{"hurry sends waiting batches at once, and later ones until done", cfg(100, 1000), []kqStep{
			kq(do.pub("a")),
			kq(do.pub("b")),
			kq(do.hurry(), "a0", "b0"),
			kq(do.delayed(0)),
			kq(do.pub("a")), // behind a0
			kq(do.done("a"), "a1"),
			kq(do.pub("c"), "c0"),
			kq(do.hurryDone()),
			kq(do.pub("d")),
			kq(do.delayed(1)),
			kq(do.advance(delay), "d0"),
			kq(do.done("a")),
			kq(do.done("b")),
			kq(do.done("c")),
			kq(do.done("d")),
		}},
		{"hurry lasts until every caller is done", cfg(100, 1000), []kqStep{
			kq(do.hurry()),
			kq(do.hurry()),
			kq(do.hurryDone()),
			kq(do.pub("a"), "a0"),
			kq(do.hurryDone()),
			kq(do.pub("b")),
			kq(do.advance(delay), "b0"),
			kq(do.done("a")),
			kq(do.done("b")),
		}},
		{"flush sends everything and waits for every key", cfg(2, 1000), []kqStep{
			kq(do.pubN("a", 3), "a0 a1"),
			kq(do.pub("b")),
			kq(do.pub("")),
			kq(do.flush(), "_0", "b0"),
			kq(do.waiting(1)),
			kq(do.done("b")),
			kq(do.done("")),
			kq(do.waiting(1)),
			kq(do.done("a"), "a2"), // without waiting for the delay
			kq(do.waiting(1)),
			kq(do.done("a")),
			kq(do.waiting(0)),
			kq(do.pub("e")), // Flush's hurry is over
			kq(do.advance(delay), "e0"),
			kq(do.done("e")),
		}},
		{"flush does not wait for a paused key", cfg(1, 1000), []kqStep{
			kq(do.pub("a"), "a0"),
			kq(do.pub("a")),
			kq(do.flush()),
			kq(do.waiting(1)),
			kq(do.fail("a", errServer)),
			kq(do.waiting(0)),
			kq(do.results(map[string]error{"a1": ErrPublishingPaused})),
		}},
		{"flush with nothing queued returns", cfg(1, 1000), []kqStep{
			kq(do.flush()),
			kq(do.waiting(0)),
		}},
		{"stop drains, then refuses", cfg(2, 1000), []kqStep{
			kq(do.pubN("a", 3), "a0 a1"),
			kq(do.pub("b")),
			kq(do.stop(), "b0"),
			kq(do.refused("b", ErrTopicStopped)),
			kq(do.refused("c", ErrTopicStopped)),
			kq(do.refused("", ErrTopicStopped)),
			kq(do.done("a"), "a2"),
			kq(do.done("b")),
			kq(do.waiting(1)),
			kq(do.done("a")),
			kq(do.waiting(0)),
			kq(do.refused("a", ErrTopicStopped)),
		}},
		{"a key's messages keep publish order across batches; sequence numbers follow queue order", PublishSettings{
			CountThreshold: 2, ByteThreshold: 1000, DelayThreshold: delay, FirstSequence: math.MaxUint32 - 1,
		}, []kqStep{
			kq(do.pub("a")),
			kq(do.pub("b")),
			kq(do.pub("a"), "a0 a1"),
			kq(do.pub("")),
			kq(do.pause("c", errRefused)),
			kq(do.refused("c")), // takes no sequence number
			kq(do.pub("b"), "b0 b1"),
			kq(do.pub("a")),
			kq(do.pub("a")),
			kq(do.pub("a")),
			kq(do.done("a"), "a2 a3"),
			kq(do.done("a")),
			kq(do.advance(delay), "_0", "a4"),
			kq(do.sequence(math.MaxUint32-1, "a0", "b0", "a1", "_0", "b1", "a2", "a3", "a4")),
			kq(do.done("a")),
			kq(do.done("b")),
			kq(do.done("")),
			kq(do.results(map[string]error{"a0": nil, "a1": nil, "a2": nil, "a3": nil, "a4": nil, "b0": nil, "b1": nil, "_0": nil})),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newQueuesHarness(t, tt.cfg)
				for i, s := range tt.steps {
					s.do.run(h)
					synctest.Wait() // a flush or stop has done what it can
					if got := h.takeSent(); !slices.Equal(got, s.sends) {
						t.Errorf("step %d (%s): sent %q, want %q", i+1, s.do.name, got, s.sends)
					}
				}
			})
		})
	}
}
