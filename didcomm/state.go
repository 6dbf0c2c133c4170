package didcomm

import (
	"encoding/json"
	"errors"
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
	Gaps gapList `json:"g,omitempty"`
	// Floor: gaps at or below it were given up when there were more than
	// MaxGapRanges of them; orders there are no longer tracked.
	Floor uint64 `json:"f,omitempty"`
	// Claims maps an order to the stream position of the copy that was
	// handed to the application and not yet acked: a redelivery of that
	// same copy is not a duplicate.
	Claims map[uint64]uint64 `json:"c,omitempty"`
	// Evicted is the largest stream position of a claim dropped to stay
	// within the thread's claim limit. A seen order arriving at or below
	// it with no claim may be that copy coming back: it is handed over
	// (at least once), not dropped.
	Evicted uint64 `json:"e,omitempty"`
	// Rank is the order in which the thread first saw its senders:
	// received_orders lists them in that order.
	Rank int `json:"r,omitempty"`
}

// gapList is saved as one flat array [first, last, first, last, ...]:
// half the bytes of objects, for state that must fit one KV value.
type gapList []Range

func (g gapList) MarshalJSON() ([]byte, error) {
	flat := make([]uint64, 0, 2*len(g))
	for _, r := range g {
		flat = append(flat, r.First, r.Last)
	}
	return json.Marshal(flat)
}

func (g *gapList) UnmarshalJSON(data []byte) error {
	var flat []uint64
	if err := json.Unmarshal(data, &flat); err != nil {
		return err
	}
	if len(flat)%2 != 0 {
		return errors.New("odd number of gap bounds")
	}
	*g = make(gapList, 0, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		*g = append(*g, Range{First: flat[i], Last: flat[i+1]})
	}
	return nil
}

// threadState is what a tracker knows of one thread, per sender.
type threadState struct {
	Senders map[string]*senderState `json:"s"`
	// claims counts the claims of every sender (not saved).
	claims int
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
			if c, ok := s.Claims[order]; pos != 0 && (ok && c == pos || !ok && pos <= s.Evicted) {
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
		t.claim(s, order, pos, lim.maxClaims)
	}
	return v, opened, abandoned, nil
}

// claim remembers that the copy at pos carries order. Beyond limit claims in
// the thread it drops the oldest (lowest position): most likely a copy
// whose ack skipped the tracker. Its sender's Evicted remembers the
// position, so that copy is never dropped as a duplicate if it comes back.
func (t *threadState) claim(s *senderState, order, pos uint64, limit int) {
	if s.Claims == nil {
		s.Claims = make(map[uint64]uint64)
	}
	if _, ok := s.Claims[order]; !ok {
		t.claims++
	}
	s.Claims[order] = pos
	for t.claims > limit {
		var (
			oldest      *senderState
			order, best uint64
		)
		for _, cs := range t.Senders {
			for o, p := range cs.Claims {
				if oldest == nil || p < best {
					oldest, order, best = cs, o, p
				}
			}
		}
		delete(oldest.Claims, order)
		oldest.Evicted = max(oldest.Evicted, best)
		t.claims--
	}
}

// countClaims sets the claim count of state just loaded.
func (t *threadState) countClaims() {
	t.claims = 0
	for _, s := range t.Senders {
		t.claims += len(s.Claims)
	}
}

// release forgets the claim of the copy at pos, once it is acked. It
// reports whether anything changed.
func (t *threadState) release(sender string, order, pos uint64) bool {
	s := t.Senders[sender]
	if c, ok := s.claimOf(order); !ok || c != pos {
		return false
	}
	delete(s.Claims, order)
	t.claims--
	return true
}

func (s *senderState) claimOf(order uint64) (uint64, bool) {
	if s == nil {
		return 0, false
	}
	c, ok := s.Claims[order]
	return c, ok
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
