package adapter

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Spreading a partitioned subscription over its receivers.
//
// The server pins each partition to the first receiver whose pull request
// it sees, so left to itself one receiver would own every partition and
// the others stand by. Instead every receiver records itself as a member
// of the subscription (the per-key mode's member records), watches the
// members, and pulls only from the partitions the assignment gives it,
// which every receiver computes alike from the same members and owner
// records (assignPartitions). When they change, a receiver that owns a
// partition now assigned elsewhere yields it: it stops pulling, lets what
// the client buffered arrive, ends its term, unpins the partition and
// hands back what no handler started, as when it loses a pin. The new
// owner's pull request is then the only one waiting, the server pins it,
// and its fence (doc.go) starts nothing until the old owner's handlers
// have settled their messages: order holds across the move.
//
// A member is removed from the view when its presence subject has no
// responders (presence.gone), or when its record is deleted (a receiver
// that ends deletes its own). Views can differ for a moment, while a
// change spreads: then two receivers may pull one partition, and the
// server's pin still gives it to one; or none may, until the change has
// reached both. A receiver follows the assignment as soon as a member or
// a recorded owner changes in its view, its own records counting as soon
// as they are written: a disagreement settled only at the next check (a
// second later) could move a partition after its last message, and the
// server pins only on delivery, so its new owner would hold no pin (and no
// status page name a holder) until the next message.

// balanceInterval is how often a receiver checks that the members it
// knows are there.
const balanceInterval = time.Second

// assignPartitions gives each of n partitions to one of members, every
// member at most ceil(n/len(members)) of them, the same way for every
// caller with the same members and current owners. A partition stays with
// its current owner (current[i], "" for none) while that owner is a
// member with room, in partition order, so a member that joins takes only
// its share and a partition moves only when it must. Each other partition
// goes to the member ranked first for it by a hash of (member, partition)
// that still has room (rendezvous hashing with a cap).
func assignPartitions(members []string, n int, current []string) []string {
	members = slices.Sorted(slices.Values(members))
	members = slices.Compact(members)
	owners := make([]string, n)
	if len(members) == 0 {
		return owners
	}
	capacity := (n + len(members) - 1) / len(members)
	load := make(map[string]int, len(members))
	for i := range min(n, len(current)) {
		if o := current[i]; o != "" && slices.Contains(members, o) && load[o] < capacity {
			owners[i] = o
			load[o]++
		}
	}
	for i := range n {
		if owners[i] != "" {
			continue
		}
		var best string
		var bestScore uint64
		for _, m := range members {
			if load[m] >= capacity {
				continue
			}
			h := fnv.New64a()
			h.Write([]byte(m))
			h.Write([]byte{0})
			h.Write([]byte(strconv.Itoa(i)))
			if s := h.Sum64(); best == "" || s > bestScore {
				best, bestScore = m, s
			}
		}
		owners[i] = best
		load[best]++
	}
	return owners
}

// join records this receiver as a member of the subscription and reads
// the members recorded; watchMembers keeps the view current. A record
// that could not be written (a cluster electing leaders) does not end
// Receive: watchMembers writes it at its next check, and meanwhile this
// receiver pulls its share as it sees it, the others theirs.
func (m *partitionedMode) join(ctx context.Context) (*lastingWatch, error) {
	prefix := m.r.sub.memberPrefix()
	m.members = map[string]uint64{} // and leave deletes the record
	if _, err := m.owners.Put(ctx, prefix+m.rid(), []byte(m.r.c.cfg.name)); err != nil {
		m.unrecorded = true
		m.r.c.cfg.logger.Warn("member record not written; trying again", "subscription", m.r.sub.id, "err", err)
	}
	w, err := watchLasting(context.Background(), m.owners, prefix+"*")
	if err != nil {
		return nil, err
	}
	for {
		select {
		case e := <-w.updates():
			if e == nil { // the initial values are in
				if err := m.loadRecorded(ctx); err != nil {
					w.stop()
					return nil, err
				}
				return w, nil
			}
			m.memberUpdate(e)
		case <-ctx.Done():
			w.stop()
			return nil, ctx.Err()
		}
	}
}

// loadRecorded reads the partitions' owner records, so that the first
// assignment keeps the owners that have them (watchOwners keeps them
// current after).
func (m *partitionedMode) loadRecorded(ctx context.Context) error {
	prefix := m.ownerPrefix()
	w, err := m.owners.Watch(ctx, prefix+"*", jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil
			}
			i, err := strconv.Atoi(strings.TrimPrefix(e.Key(), prefix))
			if rec, ok := parseOwnerRecord(e.Value()); err == nil && ok {
				m.setRecorded(i, rec.receiver, e.Revision())
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// memberUpdate applies one entry of the members' watch.
func (m *partitionedMode) memberUpdate(e jetstream.KeyValueEntry) {
	id := strings.TrimPrefix(e.Key(), m.r.sub.memberPrefix())
	if e.Operation() == jetstream.KeyValuePut {
		m.members[id] = e.Revision()
	} else {
		delete(m.members, id)
	}
}

// leave deletes this receiver's member record, if start got as far as
// writing one.
func (m *partitionedMode) leave(deadline time.Time) {
	if m.owners == nil || m.members == nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_ = m.owners.Delete(ctx, m.r.sub.memberPrefix()+m.rid())
}

// assignment is which partitions are this receiver's among the members it
// knows (itself always among them).
func (m *partitionedMode) assignment() []bool {
	ids := []string{m.rid()}
	for id := range m.members {
		ids = append(ids, id)
	}
	owners := assignPartitions(ids, len(m.parts), m.currentOwners())
	mine := make([]bool, len(owners))
	for i, o := range owners {
		mine[i] = o == m.rid()
	}
	return mine
}

// currentOwners are the partitions' recorded owners, as watchOwners last
// read them ("" for none).
func (m *partitionedMode) currentOwners() []string {
	m.recordedMu.Lock()
	defer m.recordedMu.Unlock()
	return slices.Clone(m.recorded)
}

// setRecorded keeps partition i's recorded owner, from the record's
// revision rev, for the assignment, unless a later revision is kept
// already (this receiver's own write comes before the watch has it). When
// the owner changed it wakes watchMembers, to follow the assignment at once
// rather than at its next check.
func (m *partitionedMode) setRecorded(i int, rid string, rev uint64) {
	m.recordedMu.Lock()
	changed := false
	if i >= 0 && i < len(m.recorded) && rev > m.recordedRev[i] {
		changed = m.recorded[i] != rid
		m.recorded[i], m.recordedRev[i] = rid, rev
	}
	m.recordedMu.Unlock()
	if changed {
		select {
		case m.rebalance <- struct{}{}:
		default:
		}
	}
}

// watchMembers keeps the members' view current and the pulls following
// it, until the mode stops.
func (m *partitionedMode) watchMembers(w *lastingWatch) {
	defer m.loops.Done()
	defer func() { w.stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-m.stopped
		cancel()
	}()
	t := time.NewTicker(balanceInterval)
	defer t.Stop()
	// The first check at once: a receiver started in place of one that
	// died finds its predecessor gone a tick sooner.
	checkNow := time.After(0)
	reconnects := m.r.c.nc.Stats().Reconnects
	goneOnce := map[string]bool{} // members found gone at the last check
	var renewed map[string]uint64 // the records a renewed watch has sent so far
	for {
		select {
		case e, ok := <-w.updates():
			switch {
			case !ok:
				if !w.renew(m.stopped, func(err error) {
					m.r.c.cfg.logger.Warn("members not watched; trying again", "subscription", m.r.sub.id, "err", err)
				}) {
					return
				}
				renewed = map[string]uint64{}
			case e != nil && renewed != nil:
				if e.Operation() == jetstream.KeyValuePut {
					renewed[strings.TrimPrefix(e.Key(), m.r.sub.memberPrefix())] = e.Revision()
				}
			case e != nil:
				m.memberUpdate(e)
				if e.Operation() != jetstream.KeyValuePut && e.Key() == m.r.sub.memberPrefix()+m.rid() {
					// Another receiver took this one for gone (it could
					// not reach it: a partition, a node restarting) and
					// deleted its record: written again at the next check,
					// or the others would leave this receiver out for good.
					m.unrecorded = true
				}
				m.follow(m.assignment())
			case renewed != nil:
				// Every record there now: members deleted while the
				// watch was down are left out, this one's own included.
				if _, ok := renewed[m.rid()]; !ok {
					m.unrecorded = true
				}
				m.members, renewed = renewed, nil
				m.follow(m.assignment())
			}
			continue
		case <-m.rebalance:
			m.follow(m.assignment())
			continue
		case <-checkNow:
			checkNow = nil
		case <-t.C:
		case <-m.stopped:
			return
		}
		// After a reconnect, another receiver may have taken this one
		// for gone and deleted its record: write it again (and one join
		// could not write, or that the watch saw deleted).
		if n := m.r.c.nc.Stats().Reconnects; n != reconnects || m.unrecorded {
			if _, err := m.owners.Put(ctx, m.r.sub.memberPrefix()+m.rid(), []byte(m.r.c.cfg.name)); err == nil {
				reconnects, m.unrecorded = n, false
			}
		}
		graced := m.r.presence.reconnectedLately()
		for id, rev := range m.members {
			if id == m.rid() {
				continue
			}
			// Gone at two checks in a row (a second apart), the first
			// outside reconnectGrace: its record goes, for the others
			// too; only the first to read it deletes it. Within the grace
			// an unanswered member may be reconnecting too, so it starts
			// no count; but one found gone before this receiver's
			// reconnect is done with at its next unanswered check, as
			// ownerFoundGone does with owners: otherwise a NATS restart
			// within a second or two of a receiver's death left that
			// receiver's partitions to nobody for the grace and two
			// checks more (7 s).
			switch err := m.r.presence.ping(ctx, id); {
			case err == nil: // there
				delete(goneOnce, id)
				continue
			case !errors.Is(err, nats.ErrNoResponders):
				continue // not told (a timeout, this connection down): the count stands
			case !goneOnce[id]:
				if !graced {
					goneOnce[id] = true
				}
				continue
			}
			delete(goneOnce, id)
			if err := m.owners.Delete(ctx, m.r.sub.memberPrefix()+id, jetstream.LastRevision(rev)); err != nil {
				// Not deleted: this receiver may be the one cut off (its
				// delete cannot reach the bucket's leader, nor its
				// presence requests the others), or the record changed
				// (deleted by another receiver, or written again by the
				// member), which the watch reports. Dropped from the view
				// regardless, the others would never come back into it:
				// their records stay, so no change of them would come,
				// and this receiver would take every partition for good.
				continue
			}
			delete(m.members, id)
		}
		// Also tries again a pull that failed to start.
		m.follow(m.assignment())
		m.tidy(ctx)
	}
}

// follow starts pulling from the partitions assigned to this receiver and
// yields those it pulls from that are not. A partition still draining
// from a yield is not pulled again until the drain is over (two
// subscriptions would feed one partition's gates).
func (m *partitionedMode) follow(mine []bool) {
	m.pullMu.Lock()
	defer m.pullMu.Unlock()
	if m.pullStopped {
		return
	}
	for i, p := range m.parts {
		switch {
		case mine[i] && p.cc == nil && p.draining == nil:
			cc, err := p.pull()
			if err != nil {
				m.r.c.cfg.logger.Warn("partition pull not started; trying again", "subscription", m.r.sub.id, "partition", i, "err", err)
				continue
			}
			p.cc = cc
			m.r.c.cfg.logger.Debug("pulling partition", "subscription", m.r.sub.id, "partition", i, "members", len(m.members)+1)
		case !mine[i] && p.cc != nil:
			p.draining, p.cc = p.cc, nil
			m.loops.Add(1)
			go p.yield(p.draining)
		}
	}
}

// yieldDrainTimeout bounds the wait for a yielded partition's buffered
// messages.
const yieldDrainTimeout = 5 * time.Second

// yield gives the partition up to the receiver it is now assigned to:
// stop pulling (what the client buffered still arrives), then let go of
// the pin (letGo). The server drops the pull requests still waiting for
// this receiver once their subscription is gone, so the new owner's is
// the one it pins. Handlers running keep their messages until they settle
// them; the new owner's fence waits for that.
func (p *partition) yield(cc jetstream.ConsumeContext) {
	m := p.m
	defer m.loops.Done()
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(yieldDrainTimeout):
	case <-m.stopped:
	}
	m.pullMu.Lock()
	p.draining = nil
	m.pullMu.Unlock()
	p.letGo()
}

// letGo ends this receiver's term of the partition, if it does not pull
// it, and unpins the partition if the server still has that term's pin.
// The term ends first: from then on no handler starts on the partition
// here (its fence, were it still up, could otherwise lift once the
// partition is unpinned, and start messages under a new owner that, as
// this receiver has no owner record yet, hands back what it does not
// hold: they would run twice, the second time after later messages of
// their keys). What no handler started is handed back (as for a pin
// lost), to the new owner. When the unpin fails (no answer from the
// server) watchMembers calls letGo again.
func (p *partition) letGo() {
	m, r := p.m, p.r
	m.pullMu.Lock()
	pulled := p.cc != nil || p.draining != nil // assigned back meanwhile: keep it
	m.pullMu.Unlock()
	if pulled {
		return
	}
	p.mu.Lock()
	var back []*delivery
	if pin := p.g.pin; pin != "" {
		p.yielded = pin
		_, back = p.g.pinAnswer(pin, "")
		p.reportLocked()
	}
	pin := p.yielded
	p.mu.Unlock()
	for _, d := range back {
		_ = r.c.nc.Publish(d.reply, ackPayload[ackNak])
	}
	if pin == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(r.c.cfg.apiTimeout, 5*time.Second))
	defer cancel()
	go func() {
		select {
		case <-m.stopped:
			cancel()
		case <-ctx.Done():
		}
	}()
	unpinned, err := p.unpinIf(ctx, pin)
	if err != nil {
		r.c.cfg.logger.Warn("partition given up not unpinned yet; trying again", "subscription", r.sub.id, "partition", p.index, "err", err)
		return
	}
	p.mu.Lock()
	if p.yielded == pin {
		p.yielded = ""
	}
	p.mu.Unlock()
	if unpinned {
		r.c.cfg.logger.Info("partition yielded to the receiver it is assigned to", "subscription", r.sub.id, "partition", p.index, "handed_back", len(back))
	}
}

// tidy, at each of watchMembers' checks, finishes what yields left:
//   - a partition this receiver neither pulls nor has let go of (its
//     unpin failed) is let go of again;
//   - the owner record of a partition it gave up and holds nothing of any
//     more is deleted, so that the new owner's fence need not wait for
//     the ack deadline of a message lost on its way to this receiver while
//     it stopped pulling: without a record, the fence hands back every
//     unacked message it does not hold (freeGoneOwners), and this
//     receiver holds none.
func (m *partitionedMode) tidy(ctx context.Context) {
	for _, p := range m.parts {
		m.pullMu.Lock()
		pulled := p.cc != nil || p.draining != nil || m.pullStopped
		m.pullMu.Unlock()
		if pulled {
			continue
		}
		p.mu.Lock()
		pin, held := p.g.pin, len(p.g.held)
		if pin == "" {
			pin = p.yielded
		}
		p.mu.Unlock()
		if pin != "" {
			m.loops.Add(1)
			go func() {
				defer m.loops.Done()
				p.letGo()
			}()
			continue
		}
		if held > 0 || m.currentOwners()[p.index] != m.rid() {
			continue
		}
		e, err := m.owners.Get(ctx, m.ownerKey(p.index))
		if err != nil {
			continue
		}
		// The assignment keeps reading the record as it was (watchOwners
		// ignores deletes), as every other receiver does: views stay
		// alike until the new owner records itself.
		if rec, ok := parseOwnerRecord(e.Value()); ok && rec.receiver == m.rid() {
			_ = m.owners.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision()))
		}
	}
}
