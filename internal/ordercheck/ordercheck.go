// Package ordercheck checks every delivery of an ordered subscription
// against the ordering guarantees:
//
//   - per (subscription, key), every delivery is of the first message not
//     yet acked: first deliveries come in publish order, a nacked or expired
//     message comes again before anything newer, and nothing acked comes
//     back;
//   - per (subscription, key), no delivery while an earlier delivery is
//     still in a handler (unacked and not handed back);
//   - nothing lost: every published message is eventually acked on every
//     subscription.
//
// NewPipelined checks pipelined ordering instead (the sidecar's and the
// library's PipelinedOrdering, Pub/Sub's own): a key's next message may be
// delivered before the previous one is acked, and a nacked or expired
// message comes again with every later one of its key, acked or not, in
// order after it:
//
//   - per (subscription, key), every delivery is of the message after the
//     key's previous delivery, or goes back to one not yet acked (the first
//     unacked, or a later one) and goes on in order from there;
//   - one handler of a key at a time, and nothing lost, as above. A
//     message may be acked after its handler returned (Released), while it
//     is out.
//
// After a process was killed (AcksMayBeLost), acks it had not yet passed
// on or stored are lost, so a key may go back to a message acked before;
// from there it must go on in order again. Such restarts are counted.
//
// Messages are identified by (key, index): the publisher numbers each key's
// messages 0, 1, 2, ... in publish order and the checker learns each
// message's position from the message itself, so deliveries that overtake
// the publisher's bookkeeping are still checked. Unkeyed messages use key ""
// and are only checked for loss and duplicates in handlers.
//
// A Checker is safe for concurrent use.
package ordercheck

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Checker records deliveries and reports violations.
type Checker struct {
	mu         sync.Mutex
	expected   map[string]int // key -> messages published
	subs       map[string]*subState
	violations []string
	maxViol    int
	lostAcks   bool
	pipelined  bool
}

type subState struct {
	keys    map[string]*keyState
	unkeyed map[int]bool // index -> acked
	inUnkey map[int]bool // index -> in a handler
	stats   Stats
}

type keyState struct {
	firstUnacked  int
	lastDelivered int // the highest index delivered so far, -1 if none
	inFlight      int // index in a handler, -1 if none
	// Pipelined only: the key's latest delivery, and the acks after
	// firstUnacked.
	last  int
	acked map[int]bool
}

// Stats counts what a subscription saw.
type Stats struct {
	Deliveries   int
	Redeliveries int // deliveries of a message delivered before
	Acks         int
	Rewinds      int // keys gone back to a message acked before (AcksMayBeLost)
}

// New returns an empty checker of strict ordering.
func New() *Checker {
	return &Checker{expected: map[string]int{}, subs: map[string]*subState{}, maxViol: 50}
}

// NewPipelined returns an empty checker of pipelined ordering.
func NewPipelined() *Checker {
	c := New()
	c.pipelined = true
	return c
}

// Encode is the payload format the checker reads back: "<key>|<index>".
func Encode(key string, index int) []byte { return []byte(key + "|" + strconv.Itoa(index)) }

// Decode parses a payload written by Encode.
func Decode(data []byte) (key string, index int, err error) {
	s := string(data)
	i := strings.LastIndexByte(s, '|')
	if i < 0 {
		return "", 0, fmt.Errorf("ordercheck: payload %q has no index", s)
	}
	index, err = strconv.Atoi(s[i+1:])
	return s[:i], index, err
}

// Published records that key's message number index was published; call it
// with increasing indexes per key (any order across keys).
func (c *Checker) Published(key string, index int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if index+1 > c.expected[key] {
		c.expected[key] = index + 1
	}
}

func (c *Checker) sub(name string) *subState {
	s := c.subs[name]
	if s == nil {
		s = &subState{keys: map[string]*keyState{}, unkeyed: map[int]bool{}, inUnkey: map[int]bool{}}
		c.subs[name] = s
	}
	return s
}

func (c *Checker) violate(format string, args ...any) {
	if len(c.violations) < c.maxViol {
		// The time of day, to find the moment in the logs of a long run.
		c.violations = append(c.violations, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

// Fail records a violation found outside the checker (a handler, say), so
// handlers need not report from their own goroutines.
func (c *Checker) Fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violate(format, args...)
}

// Delivered records that a handler of sub received key's message index.
func (c *Checker) Delivered(sub, key string, index int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sub(sub)
	s.stats.Deliveries++
	if key == "" {
		if _, seen := s.unkeyed[index]; seen {
			s.stats.Redeliveries++
		}
		if s.inUnkey[index] {
			c.violate("%s: unkeyed message %d delivered while already in a handler", sub, index)
		}
		if !s.unkeyed[index] {
			s.unkeyed[index] = false
		}
		s.inUnkey[index] = true
		return
	}
	k := s.keys[key]
	if k == nil {
		k = &keyState{lastDelivered: -1, inFlight: -1, last: -1, acked: map[int]bool{}}
		s.keys[key] = k
	}
	if k.inFlight >= 0 {
		c.violate("%s: key %q message %d delivered while message %d is unacked in a handler", sub, key, index, k.inFlight)
	}
	if c.pipelined {
		c.deliveredPipelined(s, sub, key, k, index)
		return
	}
	switch {
	case index < k.firstUnacked && c.lostAcks:
		s.stats.Rewinds++
		k.firstUnacked = index
	case index < k.firstUnacked:
		c.violate("%s: key %q message %d delivered again after it was acked (first unacked is %d)", sub, key, index, k.firstUnacked)
	case index > k.firstUnacked:
		c.violate("%s: key %q message %d delivered before message %d was acked", sub, key, index, k.firstUnacked)
	}
	if index <= k.lastDelivered {
		s.stats.Redeliveries++
	}
	k.lastDelivered = max(k.lastDelivered, index)
	k.inFlight = index
}

// deliveredPipelined checks a delivery of key's message index with
// pipelined ordering.
func (c *Checker) deliveredPipelined(s *subState, sub, key string, k *keyState, index int) {
	switch {
	case index == k.last+1 && index >= k.firstUnacked:
	case index < k.firstUnacked && c.lostAcks:
		s.stats.Rewinds++
		k.firstUnacked = index
	case index < k.firstUnacked:
		c.violate("%s: key %q message %d delivered again after it was acked (first unacked is %d)", sub, key, index, k.firstUnacked)
	case index > k.last+1:
		c.violate("%s: key %q message %d delivered after message %d: message %d skipped", sub, key, index, k.last, k.last+1)
	}
	if index <= k.last {
		// Gone back: this one and every later one come again, acked or
		// not; their acks were not kept.
		for i := range k.acked {
			if i >= index {
				delete(k.acked, i)
			}
		}
	}
	if index <= k.lastDelivered {
		s.stats.Redeliveries++
	}
	k.lastDelivered = max(k.lastDelivered, index)
	k.last = index
	k.inFlight = index
}

// Acked records that sub's handler acked key's message index.
func (c *Checker) Acked(sub, key string, index int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sub(sub)
	s.stats.Acks++
	if key == "" {
		s.unkeyed[index] = true
		delete(s.inUnkey, index)
		return
	}
	k := s.keys[key]
	if k == nil {
		c.violate("%s: key %q message %d acked but never delivered", sub, key, index)
		return
	}
	if c.pipelined {
		switch {
		case k.inFlight == index:
			k.inFlight = -1
		case index < k.firstUnacked || index > k.last:
			// Acked after its handler returned (Released) is fine, but only
			// for a message out: delivered, not acked, not gone back past.
			c.violate("%s: key %q message %d acked but not out (first unacked %d, last delivered %d)", sub, key, index, k.firstUnacked, k.last)
			return
		}
		k.acked[index] = true
		for k.acked[k.firstUnacked] {
			delete(k.acked, k.firstUnacked)
			k.firstUnacked++
		}
		return
	}
	if k.inFlight != index {
		c.violate("%s: key %q message %d acked but not in a handler", sub, key, index)
		return
	}
	k.inFlight = -1
	if index == k.firstUnacked {
		k.firstUnacked++
	}
}

// AcksMayBeLost tells the checker that a process was killed: from now on
// a key may go back to a message acked before (its ack was lost with the
// process), and must then go on in order from there. A message that went
// back is a redelivery, not a new first delivery.
func (c *Checker) AcksMayBeLost() {
	c.mu.Lock()
	c.lostAcks = true
	c.mu.Unlock()
}

// Released records that sub's handler gave key's message index back without
// acking it (a nack, or returning and letting the deadline pass).
func (c *Checker) Released(sub, key string, index int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sub(sub)
	if key == "" {
		delete(s.inUnkey, index)
		return
	}
	if k := s.keys[key]; k != nil && k.inFlight == index {
		k.inFlight = -1
	}
}

// Violations returns what went wrong so far (at most 50).
func (c *Checker) Violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.violations...)
}

// Complete reports whether sub has acked every published message.
func (c *Checker) Complete(sub string) bool { return c.Missing(sub) == "" }

// Missing describes what sub has not acked yet ("" when complete).
func (c *Checker) Missing(sub string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sub(sub)
	var missing []string
	for key, n := range c.expected {
		if key == "" {
			acked := 0
			for _, a := range s.unkeyed {
				if a {
					acked++
				}
			}
			if acked < n {
				missing = append(missing, fmt.Sprintf("unkeyed: %d of %d acked", acked, n))
			}
			continue
		}
		got := 0
		if k := s.keys[key]; k != nil {
			got = k.firstUnacked
		}
		if got < n {
			missing = append(missing, fmt.Sprintf("key %q: %d of %d acked", key, got, n))
		}
	}
	sort.Strings(missing)
	if len(missing) > 5 {
		missing = append(missing[:5], fmt.Sprintf("... and %d more", len(missing)-5))
	}
	return strings.Join(missing, "; ")
}

// Stats returns sub's counts.
func (c *Checker) Stats(sub string) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sub(sub).stats
}

// AckedThrough is the last index of key on sub up to which every message
// is acked: -1 when its first is not.
func (c *Checker) AckedThrough(sub, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.sub(sub).keys[key]
	if k == nil {
		return -1
	}
	return k.firstUnacked - 1
}
