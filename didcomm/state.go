package didcomm

import (
	"slices"
	"sort"
)

// Range is the orders First..Last, both included.
type Range struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
}

// Len is the number of orders in r.
func (r Range) Len() uint64 { return r.Last - r.First + 1 }

// senderState is what a tracker knows of one sender in one thread: every
// order in 1..Last that is neither in Gaps nor at or below Floor has been
// seen. Gaps are ranges, so a jump from 3 to 10^12 costs one range.
type senderState struct {
	Last uint64 `json:"l"`
	// Gaps are the missing orders below Last: ascending, disjoint, not
	// adjacent, all above Floor.
	Gaps []Range `json:"g,omitempty"`
	// Floor: gaps at or below it were given up when there were more than
	// MaxGapRanges of them; orders there are no longer tracked.
	Floor uint64 `json:"f,omitempty"`
	// Claims maps an order to the stream position of the copy that was
	// handed to the application and not yet acked: a redelivery of that
	// same copy is not a duplicate.
	Claims map[uint64]uint64 `json:"c,omitempty"`
	// Rank is the order in which the thread first saw its senders:
	// received_orders lists them in that order.
	Rank int `json:"r,omitempty"`
}

// threadState is what a tracker knows of one thread, per sender.
type threadState struct {
	Senders map[string]*senderState `json:"s"`
}

// verdict is what observing one message decided.
type verdict int

const (
	inOrder    verdict = iota // the next order after Last
	early                     // above Last+1: opened a gap
	late                      // filled (part of) a gap
	untracked                 // at or below Floor: cannot tell; handed over
	redelivery                // the claimed copy again
	duplicate                 // a copy of a message already handed over
)

// limits bound one thread's state.
type limits struct {
	maxGapRanges int
	maxClaims    int
	maxSenders   int
}

// observe records order from sender, delivered at stream position pos (0:
// none), and says what it was. opened is the gap an early message opened;
// abandoned are gaps given up to stay within maxGapRanges.
func (t *threadState) observe(sender string, order, pos uint64, lim limits) (v verdict, opened Range, abandoned []Range, err error) {
	s := t.Senders[sender]
	if s == nil {
		if len(t.Senders) >= lim.maxSenders {
			return 0, Range{}, nil, ErrTooManySenders
		}
		s = &senderState{Rank: len(t.Senders)}
		if t.Senders == nil {
			t.Senders = make(map[string]*senderState)
		}
		t.Senders[sender] = s
	}
	switch {
	case order <= s.Floor:
		return untracked, Range{}, nil, nil
	case order > s.Last:
		v = inOrder
		if order > s.Last+1 {
			v, opened = early, Range{First: s.Last + 1, Last: order - 1}
			s.Gaps = append(s.Gaps, opened)
		}
		s.Last = order
	default:
		i := sort.Search(len(s.Gaps), func(i int) bool { return s.Gaps[i].Last >= order })
		if i == len(s.Gaps) || s.Gaps[i].First > order {
			if pos != 0 && s.Claims[order] == pos {
				return redelivery, Range{}, nil, nil
			}
			return duplicate, Range{}, nil, nil
		}
		v = late
		g := s.Gaps[i]
		switch {
		case g.First == order && g.Last == order:
			s.Gaps = slices.Delete(s.Gaps, i, i+1)
		case g.First == order:
			s.Gaps[i].First++
		case g.Last == order:
			s.Gaps[i].Last--
		default:
			s.Gaps[i].Last = order - 1
			s.Gaps = slices.Insert(s.Gaps, i+1, Range{First: order + 1, Last: g.Last})
		}
	}
	for len(s.Gaps) > lim.maxGapRanges {
		abandoned = append(abandoned, s.Gaps[0])
		s.Floor = s.Gaps[0].Last
		s.Gaps = slices.Delete(s.Gaps, 0, 1)
	}
	if pos != 0 {
		s.claim(order, pos, lim.maxClaims)
	}
	return v, opened, abandoned, nil
}

// claim remembers that the copy at pos carries order, dropping the lowest
// claims beyond max: those belong to copies long handed over whose acks
// never came (an ack that skipped the tracker).
func (s *senderState) claim(order, pos uint64, max int) {
	if s.Claims == nil {
		s.Claims = make(map[uint64]uint64)
	}
	s.Claims[order] = pos
	for len(s.Claims) > max {
		lowest := uint64(0)
		for o := range s.Claims {
			if lowest == 0 || o < lowest {
				lowest = o
			}
		}
		delete(s.Claims, lowest)
	}
}

// release forgets the claim of the copy at pos, once it is acked. It
// reports whether anything changed.
func (t *threadState) release(sender string, order, pos uint64) bool {
	s := t.Senders[sender]
	if s == nil || s.Claims[order] != pos {
		return false
	}
	delete(s.Claims, order)
	return true
}

// receivedOrders renders the thread's gap detectors, senders in the order
// the thread first saw them,
// each listing at most maxGaps missing orders (the lowest) and counting
// the rest in GapsOmitted.
func (t *threadState) receivedOrders(maxGaps int) []ReceivedOrder {
	ids := make([]string, 0, len(t.Senders))
	for id := range t.Senders {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return t.Senders[a].Rank - t.Senders[b].Rank })
	out := make([]ReceivedOrder, 0, len(ids))
	for _, id := range ids {
		s := t.Senders[id]
		ro := ReceivedOrder{ID: id, Last: s.Last, Gaps: []uint64{}}
		for _, g := range s.Gaps {
			n := g.Len()
			room := uint64(maxGaps - len(ro.Gaps))
			if n > room {
				ro.GapsOmitted += n - room
				n = room
			}
			for o := g.First; o < g.First+n; o++ {
				ro.Gaps = append(ro.Gaps, o)
			}
		}
		out = append(out, ro)
	}
	return out
}
