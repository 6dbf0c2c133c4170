package adapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fast take-over of a partition whose owner is gone.
//
// Left to the server, a partition whose owner dies waits twice: its pin
// stays with the dead client for the consumer's PinnedTTL, and the new
// owner's fence waits for every message the dead owner held to come back
// at its ack deadline. Both waits are only needed while the old owner may
// still act. So each owner, before its first handler of a term starts,
// records itself in the partition's owner record (receiver id and pin),
// and every receiver answers on a presence subject of its own while it
// runs (presence.go). Then:
//
//   - a receiver that does not own the partition, sees messages waiting
//     and the pin held by the recorded owner, unpins the partition when
//     that owner is gone, and the server pins its own waiting pull request;
//   - a fenced owner whose recorded predecessor is gone nacks every unacked
//     message of the partition it does not hold itself, and the server
//     redelivers them to it at once, instead of at their ack deadline.
//
// The fence itself is unchanged: the new owner still starts nothing until
// every unacked message of the partition is in its hands. What changes is
// only how soon a dead owner's messages come back. A receiver that is not
// dead but lost its connection (a network partition, not a crash) is taken
// for dead too: a message its handler still runs is delivered again to the
// new owner before its ack deadline passed, as the Pub/Sub service does
// once a deadline passes (docs/RELIABILITY.md).

// ownerRecord is who owns a partition, as the owner wrote it before its
// first handler of a term started.
type ownerRecord struct {
	receiver, pin string
}

func (o ownerRecord) String() string { return o.receiver + " " + o.pin }

func parseOwnerRecord(v []byte) (ownerRecord, bool) {
	rid, pin, ok := strings.Cut(string(v), " ")
	return ownerRecord{rid, pin}, ok && rid != ""
}

// ownerKey is the state bucket key of partition i's owner record.
func (m *partitionedMode) ownerKey(i int) string { return m.ownerPrefix() + strconv.Itoa(i) }

// ownerPrefix is what every owner record key of the subscription's epoch
// starts with.
func (m *partitionedMode) ownerPrefix() string {
	return m.r.sub.kvKey() + ".owners.e" + strconv.FormatUint(m.r.rec.Epoch, 10) + "."
}

// openOwners opens the owner records' bucket.
func (m *partitionedMode) openOwners(ctx context.Context) error {
	kv, err := m.r.c.stateBucket(ctx)
	if err != nil {
		return err
	}
	m.owners = kv
	return nil
}

// rid is this receiver's presence id, which its owner records name.
func (m *partitionedMode) rid() string { return m.r.presence.id }

// ping asks whether the receiver rid is there (presence.ping).
func (m *partitionedMode) ping(ctx context.Context, rid string) error {
	return m.r.presence.ping(ctx, rid)
}

// recordedOwner reads partition p's owner record. found is false, with no
// error, when no receiver ever recorded itself for the partition (in this
// epoch).
func (p *partition) recordedOwner(ctx context.Context) (rec ownerRecord, found bool, err error) {
	e, err := p.m.owners.Get(ctx, p.m.ownerKey(p.index))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ownerRecord{}, false, nil
	}
	if err != nil {
		return ownerRecord{}, false, err
	}
	rec, ok := parseOwnerRecord(e.Value())
	if !ok {
		return ownerRecord{}, false, fmt.Errorf("owner record %q not understood", e.Value())
	}
	return rec, true, nil
}

// recordOwner writes this receiver, with pin, as partition p's owner.
func (p *partition) recordOwner(ctx context.Context, pin string) error {
	rev, err := p.m.owners.Put(ctx, p.m.ownerKey(p.index), []byte(ownerRecord{p.m.rid(), pin}.String()))
	if err != nil {
		return err
	}
	// The assignment counts it now, not once the watch brings it back:
	// until then this receiver's view of who holds what would differ
	// from the others'.
	p.m.setRecorded(p.index, p.m.rid(), rev)
	return nil
}

// freeGoneOwners nacks every unacked message of the partition that this
// receiver does not hold, when nobody alive can hold one: the recorded
// owner is another receiver that is gone, or this one, or there is no
// record at all (whoever was pinned before never started a handler: it died
// in its fence, or is fenced and started nothing). (An owner records
// itself before its first handler starts, so no receiver that started a
// handler of the partition since this one's record can exist; one that was
// pinned meanwhile and fenced started none.) The server then redelivers
// them now instead of at their ack deadline: a dead owner's messages, a
// delivery lost on the way to this one, or messages acked here whose acks
// the server lost in a restart after a crash (the gates ack those again,
// unseen). info is the consumer's, taken by the fence. It reports whether
// it nacked anything.
func (p *partition) freeGoneOwners(ctx context.Context, info *jetstream.ConsumerInfo) bool {
	rec, found, err := p.recordedOwner(ctx)
	if err != nil || (found && rec.receiver != p.m.rid() && !p.m.ownerGone(ctx, p.index, rec)) {
		return false
	}
	return p.nackUnheld(ctx, info, rec) > 0
}

// nackUnheld nacks every unacked message of the partition, as of info,
// that this receiver does not hold; rec is the gone owner, for the log
// (zero: nobody ever recorded itself).
func (p *partition) nackUnheld(ctx context.Context, info *jetstream.ConsumerInfo, rec ownerRecord) int {
	r := p.r
	// Any delivery sequence from the consumer's ack floor to its last
	// delivery is one the server takes a nack by; the nack names the
	// message by its stream sequence.
	prefix := fmt.Sprintf("$JS.ACK.%s.%s.1.", info.Stream, info.Name)
	suffix := fmt.Sprintf(".%d.%d.0", info.Delivered.Consumer, time.Now().UnixNano())
	limit := 4 * max(r.rec.PartitionBuffer, 1)
	// What a lagging replica leaves out here is found by a later look
	// (the fence's, every second), and the fence waits for it meanwhile.
	seqs, err := r.c.streamSeqs(ctx, info.Stream, info.Config.FilterSubject, info.AckFloor.Stream+1, info.Delivered.Stream, limit)
	if err != nil {
		r.c.cfg.logger.Debug("unacked messages of partition not all found", "subscription", r.sub.id, "partition", p.index, "found", len(seqs), "err", err)
	}
	nacked := 0
	for _, found := range seqs {
		p.mu.Lock()
		_, held := p.g.held[found]
		p.mu.Unlock()
		if !held {
			_ = r.c.nc.Publish(prefix+strconv.FormatUint(found, 10)+suffix, ackPayload[ackNak])
			nacked++
		}
	}
	switch {
	case nacked > 0 && rec.receiver == p.m.rid():
		r.c.cfg.logger.Info("unacked messages of partition nobody holds (lost on the way, or acks the server lost) are delivered again now",
			"subscription", r.sub.id, "partition", p.index, "messages", nacked)
	case nacked > 0 && rec.receiver == "":
		r.c.cfg.logger.Info("unacked messages of a partition nobody took over (its pin holder never recorded itself) are delivered again now",
			"subscription", r.sub.id, "partition", p.index, "messages", nacked)
	case nacked > 0:
		r.c.cfg.logger.Info("previous owner of partition is gone: its unacked messages are delivered again now",
			"subscription", r.sub.id, "partition", p.index, "previous_owner", rec.receiver, "messages", nacked)
	}
	return nacked
}

// watchOwners watches the subscription's owner records and, twice a
// second, asks whether the recorded owners of the partitions this receiver
// does not own are still there (one presence request per owner, no
// JetStream call while they are). For a partition whose recorded owner is
// gone it unpins the partition if that owner holds the pin, so that the
// server pins a waiting pull request instead of waiting for the pin's TTL,
// and nacks its unacked messages, so that they come back now. (With
// nothing new to deliver, no message would reach a new owner, and its
// fence never start, before their ack deadline.) A partition nobody ever
// recorded itself for is freed the same way, without asking anyone: every
// receiver pinned to it so far died or waits in its fence, having started
// nothing (a process killed while its first fences were up, its
// successor, or a NATS server restart that cleared the pins, would
// otherwise wait for the ack deadline of what it pulled).
func (m *partitionedMode) watchOwners() {
	defer m.loops.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := m.ownerPrefix()
	w := watchLastingUntil(m.stopped, m.owners, prefix+"*", func(err error) {
		m.r.c.cfg.logger.Warn("owner records not watched; trying again", "subscription", m.r.sub.id, "err", err)
	}, jetstream.IgnoreDeletes())
	if w == nil {
		return
	}
	defer func() { w.stop() }()
	records := make(map[int]ownerRecord)
	loaded := false // the watch's initial values are in: a missing record is none
	// when to look again at a partition without a record: one found quiet
	// (nothing pending or unacked) costs a consumer info every few seconds
	// only, not twice a second
	nextLook := make([]time.Time, len(m.parts))
	reconnects := m.r.c.nc.Stats().Reconnects
	lostAcks := make(map[int]bool) // owned partitions to check for acks the server lost
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case e, ok := <-w.updates():
			if !ok {
				if !w.renew(m.stopped, func(err error) {
					m.r.c.cfg.logger.Warn("owner records not watched; trying again", "subscription", m.r.sub.id, "err", err)
				}) {
					return
				}
				// The new watch sends every record there now: those
				// deleted meanwhile are gone from it.
				clear(records)
				loaded = false
				continue
			}
			if e != nil {
				i, err := strconv.Atoi(strings.TrimPrefix(e.Key(), prefix))
				if rec, ok := parseOwnerRecord(e.Value()); err == nil && ok {
					records[i] = rec
					m.setRecorded(i, rec.receiver, e.Revision())
				}
				continue
			}
			// The initial values are in: look at once (a restarted
			// process's predecessor is gone).
			loaded = true
			m.r.c.cfg.logger.Debug("owner records loaded", "subscription", m.r.sub.id, "records", len(records))
		case <-t.C:
		case <-m.stopped:
			return
		}
		if n := m.r.c.nc.Stats().Reconnects; n != reconnects {
			reconnects = n
			for _, p := range m.parts {
				lostAcks[p.index] = true
			}
			clear(nextLook) // the server may have restarted: pins are gone
		}
		// Beside the take-overs, not before them: each can wait for its
		// timeout while the server comes back.
		var takes sync.WaitGroup // partitions are taken over together: each costs round trips
		recovered := make([]bool, len(m.parts))
		for i := range lostAcks {
			takes.Go(func() { recovered[i] = m.parts[i].recoverLostAcks(ctx) })
		}
		answers := make(map[string]error) // each owner asked once: presence.ping's answer
		now := time.Now()
		for _, p := range m.parts {
			rec, ok := records[p.index]
			p.mu.Lock()
			owned := p.g.pin != ""
			p.mu.Unlock()
			switch {
			case owned || (ok && rec.receiver == m.rid()):
				continue
			case !ok:
				if loaded && !now.Before(nextLook[p.index]) {
					takes.Go(func() {
						if p.takeFromGone(ownerRecord{}) {
							nextLook[p.index] = time.Now().Add(quietLook)
						}
					})
				}
				continue
			}
			answer, asked := answers[rec.receiver]
			if !asked {
				answer = m.ping(ctx, rec.receiver)
				answers[rec.receiver] = answer
			}
			if m.ownerFoundGone(p.index, rec, answer) {
				takes.Go(func() { p.takeFromGone(rec) })
			}
		}
		takes.Wait()
		for i, ok := range recovered {
			if ok {
				delete(lostAcks, i)
			}
		}
	}
}

// quietLook is how often watchOwners looks at a partition without an
// owner record that had nothing pending or unacked.
const quietLook = 3 * time.Second

// ownerGone reports whether rec, partition i's recorded owner (another
// receiver), is to be taken for gone (ownerFoundGone).
func (m *partitionedMode) ownerGone(ctx context.Context, i int, rec ownerRecord) bool {
	return m.ownerFoundGone(i, rec, m.ping(ctx, rec.receiver))
}

// ownerFoundGone decides whether partition i's recorded owner rec is gone,
// given what its presence answered now (presence.ping), and remembers an
// owner found gone: unanswered (no subscription) outside reconnectGrace.
// An owner that answered is not gone, and what was found before no longer
// holds. Otherwise (within the grace, where presence proves nothing, or not
// told: a timeout, this connection down) an owner found gone before is
// still taken for gone while its record is unchanged: its partition was
// being taken over (unpinned, its messages nacked, perhaps into the
// connection that broke), and one that came back and took the partition
// anew would have recorded a new pin. Without this, a NATS server crash
// during a take-over made the partition wait reconnectGrace and more (and
// a look while the connection was down, which could ask nobody, forgot
// what was found).
func (m *partitionedMode) ownerFoundGone(i int, rec ownerRecord, answer error) bool {
	m.goneMu.Lock()
	defer m.goneMu.Unlock()
	switch {
	case answer == nil:
		delete(m.goneOwners, i)
		return false
	case errors.Is(answer, nats.ErrNoResponders) && !m.r.presence.reconnectedLately():
		if m.goneOwners == nil {
			m.goneOwners = make(map[int]ownerRecord)
		}
		m.goneOwners[i] = rec
		return true
	default:
		return m.goneOwners[i] == rec
	}
}

// recoverLostAcks runs after this receiver's connection came back: the
// server may have restarted, and come back with acks it had answered lost
// (docs/RELIABILITY.md). Those messages are unacked, held by nobody, until
// their ack deadline, and a successor taking the partition over meanwhile
// would not know they were acked. An owner nacks them at once, so they
// come back to it while it still remembers them, and its gates ack them
// again unseen. It reports whether the partition is done with (not owned,
// or checked).
func (p *partition) recoverLostAcks(ctx context.Context) bool {
	p.mu.Lock()
	owned := p.g.pin != ""
	p.mu.Unlock()
	if !owned {
		return true // a new owner fences, which does the same
	}
	ctx, cancel := context.WithTimeout(ctx, p.r.c.takeOverTimeout())
	defer cancel()
	info, err := p.info(ctx)
	if err != nil {
		// the server may not be back yet
		p.r.c.cfg.logger.Debug("acks the server lost not looked for yet: no consumer info", "subscription", p.r.sub.id, "partition", p.index, "err", err)
		return false
	}
	if info.NumAckPending > 0 {
		p.nackUnheld(ctx, info, ownerRecord{receiver: p.m.rid()})
	}
	return true
}

// unrecordedPinGrace is how long a partition whose owner is gone may stay
// pinned to a receiver that has not recorded itself before takeFromGone
// unpins it: far more than a fence takes once the owner is gone, far less
// than the pin's TTL.
const unrecordedPinGrace = 1500 * time.Millisecond

// takeFromGone frees p from rec, its recorded owner, which is gone, or
// from whoever pulled its messages without ever recording itself (rec
// zero) (watchOwners). It reports whether the partition was found quiet:
// nothing pending or unacked.
func (p *partition) takeFromGone(rec ownerRecord) (quiet bool) {
	r := p.r
	ctx, cancel := context.WithTimeout(context.Background(), r.c.takeOverTimeout())
	defer cancel()
	info, err := p.info(ctx)
	if err != nil {
		r.c.cfg.logger.Debug("partition not taken over: no consumer info", "subscription", r.sub.id, "partition", p.index, "err", err)
		return false
	}
	if info.NumPending == 0 && info.NumAckPending == 0 {
		return true
	}
	if rec.receiver == "" {
		// The watch may lag behind a record just written: ask the bucket.
		if _, found, err := p.recordedOwner(ctx); err != nil || found {
			return false
		}
	}
	pinned := pinnedIn(info)
	if pinned != "" && pinned != rec.pin {
		// Pinned to another than the recorded owner: a receiver in its
		// fence (it records itself before the fence lifts), about to take
		// the partition over, or one that died before it recorded itself
		// (a NATS server restart re-pins, so the owner fences again). A
		// fenced holder has started nothing, so unpinning it costs only
		// time; after unrecordedPinGrace it is unpinned, and whoever is
		// pinned next frees the gone owner's messages in its fence. (With
		// no record at all, every holder so far was such a one.)
		//
		// Only a receiver pulling the partition does this: it is the one
		// the pin holds up, and several receivers unpinning the same pin
		// could unpin the receiver pinned after the first unpin instead.
		if at := pinnedAt(info); at.IsZero() || time.Since(at) < unrecordedPinGrace || !p.pulled() {
			return
		}
		if unpinned, err := p.unpinIf(ctx, pinned); err != nil || !unpinned {
			if err != nil {
				r.c.cfg.logger.Debug("unpin of a partition pinned to a receiver that never took it over failed", "subscription", r.sub.id, "partition", p.index, "err", err)
			}
			return
		}
		r.c.cfg.logger.Info("partition pinned to a receiver that has not taken it over for a while, after its owner left or before any owner: unpinned it",
			"subscription", r.sub.id, "partition", p.index, "previous_owner", rec.receiver, "pinned_for", time.Since(pinnedAt(info)).Round(time.Millisecond))
		return
	}
	if pinned != "" {
		unpinned, err := p.unpinIf(ctx, pinned)
		if err != nil {
			r.c.cfg.logger.Debug("unpin of a gone owner's partition failed", "subscription", r.sub.id, "partition", p.index, "err", err)
			return
		}
		if !unpinned {
			return // another receiver unpinned it first: the new owner frees what the gone one held
		}
		r.c.cfg.logger.Info("partition owner is gone: unpinned it to take it over", "subscription", r.sub.id, "partition", p.index, "previous_owner", rec.receiver)
	}
	if info.NumAckPending > 0 {
		p.nackUnheld(ctx, info, rec)
	}
	return false
}

// unpinIf unpins the partition if the server still has pin, as asked just
// before. An unpin names no pin: it takes whatever pin the server has when
// it arrives. The caller decided on an earlier look (and another receiver
// may have unpinned the same pin meanwhile, letting a new owner in), so
// the pin is looked at again right before, which leaves a round trip, not
// the whole decision, for the pin to change in.
func (p *partition) unpinIf(ctx context.Context, pin string) (bool, error) {
	info, err := p.info(ctx)
	if err != nil {
		return false, err
	}
	if pinnedIn(info) != pin {
		return false, nil
	}
	return true, p.stream.UnpinConsumer(ctx, info.Name, partitionGroup)
}

// pulled reports whether this receiver pulls the partition.
func (p *partition) pulled() bool {
	p.m.pullMu.Lock()
	defer p.m.pullMu.Unlock()
	return p.cc != nil
}
