package adapter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// Fast take-over in per-key delivery.
//
// Left to the server, a key whose message was pushed to a receiver that
// died waits for that message's ack deadline: its consumer (MaxAckPending
// 1) delivers nothing else meanwhile. Nothing records which receiver a
// message was pushed to (the push subscription is a queue group), so:
//
//   - every receiver records itself as a member of the subscription
//     before it subscribes to deliveries, answers on its presence subject
//     while it runs (presence.go), and removes its record when it ends;
//   - the holder of the discovery lease watches the members, and when one
//     is gone (or the lease's holder was, and it took the lease over)
//     sweeps: it pauses every key consumer with a message unacked, asks
//     every other member which of those messages it holds, and nacks the
//     rest, so the server redelivers them now, before resuming the
//     consumers.
//
// The pause keeps the server from redelivering any of them (their ack
// deadline passing) while the members are asked. A member that holds none
// of a message when asked may still have it on the way to it (pushed just
// before the pause): it remembers the delivery as revoked, and drops it if
// it arrives, so only the redelivery that the nack brings runs. A member
// that does not answer in time, short of being gone, ends the sweep with
// nothing nacked: the messages come back at their ack deadline instead.

// revocation is a delivery a sweep handed back: every delivery of the
// message up to consumer sequence upTo is dropped on arrival.
type revocation struct {
	upTo uint64
	at   time.Time
}

// revocationLife is how long a revocation is kept: far longer than a
// pushed message takes to arrive.
const revocationLife = time.Minute

// memberPrefix is what the member records of the subscription's receivers
// start with, in the state bucket.
func (s *Subscription) memberPrefix() string { return s.kvKey() + ".members." }

// holdCheck is one line of a hold check: a key consumer's unacked message
// and the consumer sequence of its last delivery.
type holdCheck struct {
	consumer  string
	seq, dseq uint64
}

func encodeHoldChecks(cs []holdCheck) []byte {
	var b bytes.Buffer
	for _, c := range cs {
		fmt.Fprintf(&b, "%s %d %d\n", c.consumer, c.seq, c.dseq)
	}
	return b.Bytes()
}

// answerHoldCheck answers a hold check (a line "consumer seq dseq" per
// message), a sweep's or a receiver's about a delivery it got
// (receiver.heldElsewhere): the lines "consumer seq" of the messages this
// receiver holds, "consumer seq acked" of those it acked lately, or
// acked a later message of their key lately (their acks may not have
// reached the server yet), and "consumer seq checking dseq" of those of
// which it is checking a twin of the asker's delivery, or a later one,
// itself (receiver.checking). Every other one it revokes. (Builds before
// "checking" read such a line as held.)
func (r *receiver) answerHoldCheck(req []byte) []byte {
	var held bytes.Buffer
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for line := range strings.Lines(string(req)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		seq, err1 := strconv.ParseUint(f[1], 10, 64)
		dseq, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		k := heldKey{consumer: f[0], seq: seq}
		if _, ok := r.held[k]; ok {
			fmt.Fprintf(&held, "%s %d\n", f[0], seq)
			continue
		}
		acked := r.ackedHereLocked(k.consumer, seq, time.Time{})
		if acked {
			// This message, or a later one of its key (so this one was
			// acked before it): a redelivery of it would take the key
			// back.
			fmt.Fprintf(&held, "%s %d acked\n", f[0], seq)
		}
		if cd, ok := r.checking[k]; ok && !acked && dseq <= cd && !r.revokedLocked(k, cd) {
			// A twin of the asker's delivery (or a later one) is being
			// checked here at the same time: the two receivers settle
			// which runs (heldElsewhere). An earlier one than the asker's
			// is stale: revoked below, as ever, and not named.
			fmt.Fprintf(&held, "%s %d checking %d\n", f[0], seq, cd)
			continue
		}
		if rv := r.revoked[k]; rv.upTo < dseq {
			r.revoked[k] = revocation{upTo: dseq, at: now}
		}
	}
	return held.Bytes()
}

// revokedLocked reports whether the delivery of k with consumer sequence
// dseq was handed back by a sweep. r.mu is held.
func (r *receiver) revokedLocked(k heldKey, dseq uint64) bool {
	rv, ok := r.revoked[k]
	return ok && dseq <= rv.upTo
}

// forgetRevocations drops revocations, and last acks, older than
// revocationLife, and leader elections older than newLeaderWindow.
func (r *receiver) forgetRevocations() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, rv := range r.revoked {
		if time.Since(rv.at) > revocationLife {
			delete(r.revoked, k)
		}
	}
	for c, a := range r.lastAcks {
		if time.Since(a.at) > revocationLife {
			delete(r.lastAcks, c)
		}
	}
	for c, e := range r.elected {
		if time.Since(e.at) > newLeaderWindow {
			delete(r.elected, c)
		}
	}
}

// lastAck is the last message of a consumer a handler of this receiver
// acked (or terminated), when it was stored, and when it was acked.
type lastAck struct {
	seq    uint64
	stored time.Time // the message's stream timestamp
	at     time.Time
}

// noteAck records d's ack as its consumer's last, before d is released:
// a hold check sees d held, or acked, never neither while the ack is on
// its way. A late ack of an earlier message does not take it back.
func (r *receiver) noteAck(d *delivery) {
	r.mu.Lock()
	if a, ok := r.lastAcks[d.key.consumer]; !ok || d.key.seq >= a.seq {
		var stored time.Time
		if d.msg != nil {
			stored = d.msg.PublishTime
		}
		r.lastAcks[d.key.consumer] = lastAck{seq: d.key.seq, stored: stored, at: time.Now()}
	}
	r.mu.Unlock()
}

// storedSlack is how much later than the last acked message a message of
// a key consumer at or before its sequence may have been stored and still
// be taken for a copy: the stream's leaders' clocks may differ by that
// much across a failover.
const storedSlack = time.Second

// ackedHereLocked reports whether a handler of this receiver acked the
// key consumer's message seq, or a later one, lately (noteAck). With
// MaxAckPending 1 a key consumer delivers a message only once the one
// before is acked, so a delivery of seq is then a copy whose ack the
// server has, or lost. stored, when known, is the delivery's stream
// timestamp: a message stored after the one acked here is not a copy
// (the topic was deleted and created again, its sequences starting
// over). A receiver that is ending (its subscription deleted, maybe
// created again under the same name) answers false: its acks are of
// another subscription's messages. r.mu is held.
func (r *receiver) ackedHereLocked(consumer string, seq uint64, stored time.Time) bool {
	a, ok := r.lastAcks[consumer]
	switch {
	case !ok || r.fatal != nil || seq > a.seq:
		return false
	case !stored.IsZero() && !a.stored.IsZero() && stored.After(a.stored.Add(storedSlack)):
		return false
	}
	return true
}

// dropAckedHere drops a key consumer's delivery of a message this
// receiver's handler acked, and acks it again. Its ack was late or lost
// on its way (a paused server held it), so the consumer delivered it
// again, and the key's next message may already be on its way to
// another receiver: running the copy would put two messages of the key
// in handlers at once, the earlier one after the later. The other
// receivers' acks are asked about for redeliveries (keyDeliveryDue); this
// receiver's own are known here.
func (r *receiver) dropAckedHere(m *nats.Msg, meta *nats.MsgMetadata) {
	r.c.cfg.logger.Debug("key consumer delivery of a message acked here: acked again, dropped", "subscription", r.sub.id,
		"consumer", meta.Consumer, "seq", meta.Sequence.Stream, "dseq", meta.Sequence.Consumer, "attempt", meta.NumDelivered)
	_ = r.c.nc.Publish(m.Reply, ackPayload[ackAck])
}

// isKeyConsumer says whether name is one of the subscription's key
// consumers (not its shared one, whose messages are acked in any order).
func (r *receiver) isKeyConsumer(name string) bool {
	return strings.HasPrefix(name, keyrouter.KeyConsumerPrefix(r.rec.Project, r.rec.nameID()))
}

// join records this receiver as a member of the subscription.
func (m *perKeyMode) join(ctx context.Context) error {
	kv, err := m.r.c.stateBucket(ctx)
	if err != nil {
		return err
	}
	m.members = kv
	if _, err := kv.Put(ctx, m.r.sub.memberPrefix()+m.r.presence.id, []byte(m.r.c.cfg.name)); err != nil {
		return fmt.Errorf("record member: %w", err)
	}
	return nil
}

// leave removes this receiver's member record.
func (m *perKeyMode) leave(deadline time.Time) {
	if m.members == nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_ = m.members.Delete(ctx, m.r.sub.memberPrefix()+m.r.presence.id)
}

// memberCheckInterval is how often the discovery lease's holder asks
// whether the members are there.
const memberCheckInterval = 500 * time.Millisecond

// watchMembers sweeps for every member found gone while ctx lasts (the
// discovery lease is held). A member gone before this discoverer took the
// lease is found at once, from the watch's initial values.
func (o *discoverer) watchMembers(ctx context.Context) {
	prefix := o.r.sub.memberPrefix()
	w := watchLastingUntil(ctx.Done(), o.members, prefix+"*", func(err error) { o.warn("members not watched; trying again", err) })
	if w == nil {
		return
	}
	defer func() { w.stop() }()
	members := make(map[string]uint64) // id -> record revision
	sweptAtStart := !o.rec.split()
	swept := make(map[string]bool) // members this discoverer swept for
	var toSweep []string           // members deleted by others, to sweep for
	t := time.NewTicker(memberCheckInterval)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.updates():
			if !ok {
				if !w.renew(ctx.Done(), func(err error) { o.warn("members not watched; trying again", err) }) {
					return
				}
				// The new watch sends every record there now; one
				// deleted meanwhile is no member to sweep for.
				clear(members)
				continue
			}
			if e != nil {
				id := strings.TrimPrefix(e.Key(), prefix)
				if e.Operation() == jetstream.KeyValuePut {
					members[id] = e.Revision()
					continue
				}
				if _, known := members[id]; known && o.rec.split() && !swept[id] && id != o.r.presence.id {
					// On a topic with key streams another stream's
					// discoverer may have deleted the record of a member it
					// found gone: this stream is swept for it too (a member
					// that left by itself costs a sweep that finds nothing).
					toSweep = append(toSweep, id)
				}
				delete(members, id)
				continue
			}
		case <-t.C:
		case <-ctx.Done():
			return
		}
		// After a reconnect the server may have restarted, and come back
		// with acks it had answered lost: those messages are unacked, held
		// by nobody, until their ack deadline. Sweep for them once every
		// member can answer again.
		if n := o.c.nc.Stats().Reconnects; n != o.sweptReconnects && o.sweep(ctx, "") {
			o.sweptReconnects = n
		}
		// On a topic with key streams, a discoverer that takes over the
		// lease of a dead member's stream may find its record deleted
		// already, by another stream's discoverer: the watch then never
		// names it. So it sweeps once for messages nobody holds.
		if !sweptAtStart && o.sweep(ctx, "") {
			sweptAtStart = true
		}
		for _, id := range toSweep {
			swept[id] = true
			o.c.cfg.logger.Debug("member deleted by another discoverer: sweeping this stream for its messages", "subscription", o.rec.ID, "member", id, "stream", o.streamName)
			o.sweep(ctx, id)
		}
		toSweep = toSweep[:0]
		for id, rev := range members {
			if ctx.Err() != nil {
				return
			}
			if id == o.r.presence.id || !o.r.presence.gone(ctx, id) {
				continue
			}
			// Only one sweeper removes the record it read. On a topic with
			// key streams each stream's discoverer sweeps its own, so one
			// whose delete lost to another's (the record is gone) sweeps
			// too.
			if err := o.members.Delete(ctx, prefix+id, jetstream.LastRevision(rev)); err != nil {
				if _, gerr := o.members.Get(ctx, prefix+id); !errors.Is(gerr, jetstream.ErrKeyNotFound) {
					continue
				}
			}
			o.c.cfg.logger.Debug("member gone: sweeping for its messages", "subscription", o.rec.ID, "member", id)
			delete(members, id)
			swept[id] = true
			o.sweep(ctx, id)
		}
	}
}

// sweep hands back every unacked message of the subscription's key
// consumers that no member holds, now that the member dead (if not "") is
// gone. It reports whether it asked every member, or had nothing to ask.
func (o *discoverer) sweep(ctx context.Context, dead string) bool {
	cctx, cancel, err := o.lease.opContext(ctx)
	if err != nil {
		return false
	}
	defer cancel()
	prefix := keyrouter.KeyConsumerPrefix(o.rec.Project, o.rec.nameID())
	var busy []string
	lister := o.stream.ListConsumers(cctx)
	for info := range lister.Info() {
		if strings.HasPrefix(info.Name, prefix) && info.NumAckPending > 0 {
			busy = append(busy, info.Name)
		}
	}
	if err := lister.Err(); err != nil {
		o.warn("sweep: list consumers", err)
		return false
	}
	if len(busy) == 0 {
		return true
	}

	// Pause them, and read what each has unacked once paused.
	var (
		mu     sync.Mutex
		paused []string
		checks []holdCheck
	)
	_ = forEachParallel(cctx, busy, cleanupWorkers, func(cctx context.Context, name string) error {
		if _, err := o.c.js.PauseConsumer(cctx, o.streamName, name, time.Now().Add(2*o.c.cfg.apiTimeout)); err != nil {
			return nil
		}
		mu.Lock()
		paused = append(paused, name)
		mu.Unlock()
		info, err := o.pausedInfo(cctx, name)
		// With MaxAckPending 1 the message unacked is the last one
		// delivered.
		if err != nil || info.NumAckPending == 0 || info.Delivered.Stream <= info.AckFloor.Stream {
			return nil
		}
		if !info.Paused {
			o.c.cfg.logger.Debug("sweep: key consumer not shown paused; its message is left to its ack deadline", "subscription", o.rec.ID, "consumer", name)
			return nil
		}
		mu.Lock()
		checks = append(checks, holdCheck{consumer: name, seq: info.Delivered.Stream, dseq: info.Delivered.Consumer})
		mu.Unlock()
		return nil
	})
	defer func() {
		_ = forEachParallel(context.Background(), paused, cleanupWorkers, func(_ context.Context, name string) error {
			o.resume(name)
			return nil
		})
	}()
	o.c.cfg.logger.Debug("sweep", "subscription", o.rec.ID, "dead", dead, "busy", len(busy), "paused", len(paused), "checks", len(checks))
	if len(checks) == 0 {
		return true
	}

	held, err := o.askMembers(cctx, dead, checks)
	if err != nil {
		o.c.cfg.logger.Debug("sweep: a member did not answer; unacked messages nobody holds come back at their ack deadline", "subscription", o.rec.ID, "err", err)
		return false
	}
	if !o.lease.valid() {
		return false
	}
	nacked := 0
	for _, c := range checks {
		if held[heldKey{consumer: c.consumer, seq: c.seq}] {
			continue
		}
		subject := fmt.Sprintf("$JS.ACK.%s.%s.1.%d.%d.%d.0", o.streamName, c.consumer, c.seq, c.dseq, time.Now().UnixNano())
		if err := o.c.nc.Publish(subject, ackPayload[ackNak]); err == nil {
			nacked++
		}
	}
	switch {
	case nacked > 0 && dead == "":
		o.c.cfg.logger.Info("unacked messages nobody holds (acks the server lost) are delivered again now",
			"subscription", o.rec.ID, "messages", nacked)
	case nacked > 0:
		o.c.cfg.logger.Info("receiver is gone: its unacked messages are delivered again now",
			"subscription", o.rec.ID, "receiver", dead, "messages", nacked)
	}
	return true
}

// pausedInfo is a key consumer's info once it shows the consumer paused:
// in a cluster the pause is answered before the consumer's leader has
// applied it (retire), and the info is asked again a few times.
func (o *discoverer) pausedInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	for try := 0; ; try++ {
		info, err := o.consumerInfo(ctx, name)
		if err != nil || info.Paused || try == 5 {
			return info, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holdCheckBatch bounds the lines of one hold-check request, well within
// NATS' default payload limit.
const holdCheckBatch = 4000

// askMembers asks every member but dead which of checks it holds. Any
// member that neither answers nor is gone makes it fail.
func (o *discoverer) askMembers(ctx context.Context, dead string, checks []holdCheck) (map[heldKey]bool, error) {
	ids, err := listMembers(ctx, o.members, o.r.sub)
	if err != nil {
		return nil, err
	}
	held := make(map[heldKey]bool)
	for start := 0; start < len(checks); start += holdCheckBatch {
		req := encodeHoldChecks(checks[start:min(start+holdCheckBatch, len(checks))])
		for _, id := range ids {
			var answer []byte
			switch id {
			case dead:
				continue
			case o.r.presence.id:
				answer = o.r.answerHoldCheck(req)
			default:
				actx, cancel := context.WithTimeout(ctx, time.Second)
				a, gone, err := o.r.presence.ask(actx, id, req)
				cancel()
				if err != nil {
					return nil, fmt.Errorf("member %s: %w", id, err)
				}
				if gone {
					continue
				}
				answer = a
			}
			for k, l := range parseHoldAnswer(answer) {
				// A message acked lately is not held: its ack may be one
				// a restarted server lost, which is what a sweep is for.
				if l.held() {
					held[k] = true
				}
			}
		}
	}
	return held, nil
}

// holdLine is one line of a hold check's answer about a message.
type holdLine struct {
	acked    bool   // the member acked it lately
	checking bool   // the member is checking a delivery of it, number dseq
	dseq     uint64 // with checking
}

// held reports whether the member holds the message, in a handler or on
// its way to one (a delivery being checked counts).
func (l holdLine) held() bool { return !l.acked }

// parseHoldAnswer reads a hold check's answer (answerHoldCheck): the
// messages the member named, and what it said of each.
func parseHoldAnswer(answer []byte) map[heldKey]holdLine {
	out := make(map[heldKey]holdLine)
	for line := range strings.Lines(string(answer)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		k := heldKey{consumer: f[0], seq: n}
		l := out[k]
		switch {
		case len(f) == 3 && f[2] == "acked":
			l.acked = true
		case len(f) == 4 && f[2] == "checking":
			l.checking = true
			l.dseq, _ = strconv.ParseUint(f[3], 10, 64)
		}
		out[k] = l
	}
	return out
}

// watchPeers keeps m.peers, the members heldElsewhere asks, from their
// records, which it watches, until ctx ends.
func (m *perKeyMode) watchPeers(ctx context.Context) {
	prefix := m.r.sub.memberPrefix()
	warn := func(err error) {
		m.r.c.cfg.logger.Warn("members not watched; trying again", "subscription", m.r.sub.id, "err", err)
	}
	w := watchLastingUntil(ctx.Done(), m.members, prefix+"*", warn)
	if w == nil {
		return
	}
	defer func() { w.stop() }()
	// A discoverer that took this receiver for gone (its presence subject
	// unanswered, around a reconnect or through a partition) deleted its
	// record: it is written again, or the other receivers' hold checks
	// would never ask this one about a message it holds. rewrite fires
	// while that is to do (again after a failed write).
	var rewrite <-chan time.Time
	for {
		select {
		case <-rewrite:
			rewrite = nil
			wctx, cancel := context.WithTimeout(ctx, m.r.c.cfg.apiTimeout)
			if _, err := m.members.Put(wctx, prefix+m.r.presence.id, []byte(m.r.c.cfg.name)); err != nil && ctx.Err() == nil {
				m.r.c.cfg.logger.Warn("member record not written again; trying again", "subscription", m.r.sub.id, "err", err)
				rewrite = time.After(time.Second)
			}
			cancel()
		case e, ok := <-w.updates():
			if !ok {
				if !w.renew(ctx.Done(), warn) {
					return
				}
				// The new watch sends every record there now: until it
				// has, the members are listed when asked (peersKnown).
				m.peersMu.Lock()
				clear(m.peers)
				m.peersKnown = false
				m.peersMu.Unlock()
				continue
			}
			m.peersMu.Lock()
			switch {
			case e == nil: // every record read
				m.peersKnown = true
			case strings.TrimPrefix(e.Key(), prefix) == m.r.presence.id:
				if e.Operation() != jetstream.KeyValuePut && rewrite == nil {
					rewrite = time.After(0)
				}
			case e.Operation() == jetstream.KeyValuePut:
				m.peers[strings.TrimPrefix(e.Key(), prefix)] = true
			default:
				delete(m.peers, strings.TrimPrefix(e.Key(), prefix))
			}
			m.peersMu.Unlock()
		case <-ctx.Done():
			return
		}
	}
}

// holdAnswer is what the other members say of a message (heldElsewhere).
type holdAnswer int

const (
	heldByNone  holdAnswer = iota
	ackedByPeer            // a member's handler acked it lately
	heldByPeer             // a member holds it: in a handler, or waiting for one
)

// yields reports whether this receiver's copy of a message, delivery
// number dseq, gives way to another member's copy, number otherDseq, that
// member other is checking at the same time: the later delivery wins (the
// earlier one is stale, and its own check finds it so), and of two with
// one number the copy of the member whose id sorts first.
func (r *receiver) yields(otherDseq uint64, other string, dseq uint64) bool {
	if otherDseq != dseq {
		return otherDseq > dseq
	}
	return other < r.presence.id
}

// peerIDs are the other members' presence ids: as watchPeers has read
// them, or, before it has read them all, as listed now.
func (m *perKeyMode) peerIDs(ctx context.Context) ([]string, error) {
	var ids []string
	m.peersMu.Lock()
	known := m.peersKnown
	for id := range m.peers {
		ids = append(ids, id)
	}
	m.peersMu.Unlock()
	if known {
		return ids, nil
	}
	all, err := listMembers(ctx, m.members, m.r.sub)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(id string) bool { return id == m.r.presence.id }), nil
}

// listMembers lists the presence ids of sub's members from their records
// in kv.
func listMembers(ctx context.Context, kv jetstream.KeyValue, sub *Subscription) ([]string, error) {
	prefix := sub.memberPrefix()
	keys, err := kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	defer func() { _ = keys.Stop() }()
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, strings.TrimPrefix(k, prefix))
	}
	return ids, nil
}

// heldElsewhere asks every other member of the subscription whether it
// holds c's message, or acked it lately; every member that does not hold
// it revokes its deliveries of the message up to c.dseq, so an earlier
// delivery still on its way there is dropped on arrival. A receiver asks
// before it hands a redelivery to a handler (keyDeliveryDue): the earlier
// delivery may still be in another member's hands, its ack deadline
// having passed while that member's server was paused or cut off, or
// reach it only now. The member's lock orders the two: it either holds
// the earlier delivery when asked, or drops it when it comes. A member
// checking a copy of the message itself at that moment (two copies of a
// first delivery, from a deposed consumer leader and its successor, as
// keyDeliveryDue says) answers so: the two settle it alike from both
// ends (receiver.yields), and one of the copies runs, unless one of the
// two does not hear the other's answer in time. An error says a member
// neither answered nor is gone.
func (m *perKeyMode) heldElsewhere(ctx context.Context, c holdCheck) (holdAnswer, error) {
	ids, err := m.peerIDs(ctx)
	if err != nil {
		return heldByNone, err
	}
	req := encodeHoldChecks([]holdCheck{c})
	k := heldKey{consumer: c.consumer, seq: c.seq}
	answers := make([]holdAnswer, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			a, gone, err := m.r.presence.ask(ctx, id, req)
			switch l, ok := parseHoldAnswer(a)[k]; {
			case err != nil:
				errs[i] = fmt.Errorf("member %s: %w", id, err)
			case gone || !ok:
			case l.acked:
				answers[i] = ackedByPeer
			case l.checking && !m.r.yields(l.dseq, id, c.dseq):
				// Both check a copy at once: the other one yields.
			default:
				answers[i] = heldByPeer
			}
		})
	}
	wg.Wait()
	out := heldByNone
	for _, a := range answers {
		out = max(out, a)
	}
	if out != heldByNone {
		return out, nil // whatever the members that did not answer hold
	}
	return heldByNone, errors.Join(errs...)
}
