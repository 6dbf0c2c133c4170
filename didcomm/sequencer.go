package didcomm

import (
	"fmt"
	"math"
	"sync"
)

// Sequencer stamps sender_order on the messages a party sends: per thread
// and sender it counts 1, 2, 3, ... It is safe for concurrent use. It keeps
// its counters in memory: a sender that restarts must Restore its threads'
// counters (from its own records of what it sent) before stamping again,
// or its new messages would repeat orders that receivers drop as copies.
type Sequencer struct {
	mu   sync.Mutex
	last map[string]map[string]uint64 // thread -> sender -> last order
}

// NewSequencer returns a sequencer with no thread started.
func NewSequencer() *Sequencer {
	return &Sequencer{last: make(map[string]map[string]uint64)}
}

// senders returns the thread's counters; s.mu must be held.
func (s *Sequencer) senders(thread string) map[string]uint64 {
	m := s.last[thread]
	if m == nil {
		m = make(map[string]uint64)
		s.last[thread] = m
	}
	return m
}

// Stamp gives h the next sender_order of its thread (thid, or its own id)
// and sender, and marks it a first send (no sent_count). It returns
// ErrMissingID or ErrMissingSender when h lacks what the order belongs to.
// To send a message again, keep its headers and call Headers.Resend
// instead: a resend keeps its order.
func (s *Sequencer) Stamp(h *Headers) error {
	if h.ID == "" {
		return ErrMissingID
	}
	if h.From == "" {
		return ErrMissingSender
	}
	s.mu.Lock()
	m := s.senders(h.ThreadID())
	if m[h.From] == math.MaxUint64 {
		s.mu.Unlock()
		return fmt.Errorf("%w: thread %q sender %q has used every order", ErrInvalidSenderOrder, h.ThreadID(), h.From)
	}
	m[h.From]++
	h.SenderOrder = m[h.From]
	s.mu.Unlock()
	h.SentCount = 0
	return nil
}

// Last is the last order stamped in the thread for sender (0: none).
func (s *Sequencer) Last(thread, sender string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[thread][sender]
}

// Restore sets the last order stamped in the thread for sender, so the
// next Stamp gives last+1. It refuses to go back: orders must not repeat.
func (s *Sequencer) Restore(thread, sender string, last uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.senders(thread)
	if last < m[sender] {
		return fmt.Errorf("%w: thread %q sender %q is at %d, cannot go back to %d", ErrInvalidSenderOrder, thread, sender, m[sender], last)
	}
	m[sender] = last
	return nil
}

// EndThread forgets the thread's counters, for every sender, to free their
// memory once the thread is over.
func (s *Sequencer) EndThread(thread string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, thread)
}
