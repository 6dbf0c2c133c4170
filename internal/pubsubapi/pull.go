package pubsubapi

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

const (
	defaultAckDeadlineSeconds = 10
	maxAckDeadlineSeconds     = 600
	// maxBatchMessages and maxBatchBytes bound one StreamingPull response
	// or Pull result (clients accept 4 MiB messages by default).
	maxBatchMessages = 1000
	maxBatchBytes    = 3 << 20
)

// StreamingPull streams a subscription's messages to the client within its
// flow control (max_outstanding_messages and _bytes of the first request),
// leased for stream_ack_deadline_seconds. Later requests may ack, modify
// deadlines, or be empty keepalive pings, each answered with an empty
// response. Every response sets subscription_properties, so the Go client
// knows whether the subscription orders messages and whether it has
// exactly-once delivery. On an exactly-once subscription a request's acks
// and deadline changes are answered with acknowledge_confirmation and
// modify_ack_deadline_confirmation, once JetStream has confirmed the acks.
func (s *Server) StreamingPull(stream pb.Subscriber_StreamingPullServer) error {
	ctx := stream.Context()
	// A stream counts from the moment it opens, not from its first
	// request: streams that never send one would otherwise be unbounded.
	if !s.openStream() {
		return status.Errorf(codes.ResourceExhausted, "too many StreamingPull streams (at most %d)", s.cfg.MaxStreams)
	}
	defer s.closeStream()
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil // the client closed without asking for anything
	}
	if err != nil {
		return err
	}
	project, id, err := parseSubscription(first.GetSubscription())
	if err != nil {
		return err
	}
	deadline, err := streamDeadline(first.GetStreamAckDeadlineSeconds())
	if err != nil {
		return err
	}
	d, err := s.attach(ctx, project, id)
	if err != nil {
		return err
	}
	defer d.detach()
	s.activity.touch(d.name)
	if d.push.Load() != nil {
		return errPushSubscription
	}

	st := &pullStream{s: s, d: d, stream: stream, flow: newFlow(first.GetMaxOutstandingMessages(), first.GetMaxOutstandingBytes()),
		own: make(chan *lease), stopped: make(chan struct{}),
		since: time.Now(), peer: peerAddr(ctx), userAgent: userAgent(ctx)}
	st.deadline.Store(int64(deadline))
	d.addStream(st)
	defer d.removeStream(st)
	defer d.streamEnded(st)
	defer close(st.stopped)
	confirm, err := st.apply(first)
	if err != nil {
		return err
	}
	// The subscription's properties go first, before any message is ready.
	if err := st.respond(confirm); err != nil {
		return err
	}
	defer st.end()
	ended := make(chan error, 1)
	go func() { ended <- st.receive() }()
	return st.run(ctx, ended)
}

func streamDeadline(secs int32) (time.Duration, error) {
	if secs < 0 || secs > maxAckDeadlineSeconds {
		return 0, invalid("stream_ack_deadline_seconds %d not in 0..%d", secs, maxAckDeadlineSeconds)
	}
	return time.Duration(secs) * time.Second, nil
}

func (s *Server) openStream() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams >= s.cfg.MaxStreams {
		return false
	}
	s.streams++
	return true
}

func (s *Server) closeStream() {
	s.mu.Lock()
	s.streams--
	s.mu.Unlock()
}

type pullStream struct {
	s        *Server
	d        *dispatcher
	stream   pb.Subscriber_StreamingPullServer
	flow     *flow
	deadline atomic.Int64 // stream ack deadline, ns; 0: the subscription's
	sendMu   sync.Mutex   // gRPC allows one sender at a time
	ended    bool         // guarded by sendMu: StreamingPull has returned
	// own takes the messages of pipelined keys that have leases out on
	// this stream (keyPipe); stopped is closed when the stream takes no
	// more.
	own     chan *lease
	stopped chan struct{}

	// For the status page: who, and since when.
	since           time.Time
	peer, userAgent string
}

func (st *pullStream) end() {
	st.sendMu.Lock()
	st.ended = true
	st.sendMu.Unlock()
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// run hands messages to the client until the stream or the dispatcher
// ends. Leases still out when it ends that the client has confirmed stay
// valid until their deadlines, as in Pub/Sub: clients ack through
// Acknowledge, which does not need the stream; the others go back
// (dispatcher.streamEnded).
func (st *pullStream) run(ctx context.Context, ended <-chan error) error {
	d := st.d
	stop := make(chan struct{})
	var endErr error
	go func() {
		select {
		case endErr = <-ended:
		case <-ctx.Done():
		}
		close(stop)
	}()
	for {
		if !st.flow.wait(stop, d.done) {
			break
		}
		var l *lease
		select {
		case l = <-d.ready:
		case l = <-st.own:
		case <-stop:
		case <-d.done:
		case <-d.draining:
		}
		if l != nil && closed(stop) {
			d.refuse(l) // the client is gone: do not lease what it cannot get
			l = nil
		}
		if l == nil {
			break
		}
		if d.push.Load() != nil { // made a push subscription meanwhile
			d.refuse(l)
			return errPushSubscription
		}
		deadline := time.Duration(st.deadline.Load())
		if deadline == 0 {
			deadline = d.ackDeadline()
		}
		batch, leased := d.leaseBatch(l, st, deadline, maxBatchMessages)
		if len(batch) == 0 {
			continue // draining: the next select ends on stop or done
		}
		if err := st.send(batch); err != nil {
			for _, id := range leased { // the client may not have them: hand them back now
				d.settle(id, outReturned)
			}
			return err
		}
	}
	select {
	case <-stop:
	case <-d.done:
		return d.endErr()
	}
	if errors.Is(endErr, io.EOF) {
		return nil // the client closed its side: a clean end
	}
	if endErr != nil {
		return endErr
	}
	return status.FromContextError(ctx.Err()).Err()
}

// receive reads the client's requests until the stream ends.
func (st *pullStream) receive() error {
	for {
		req, err := st.stream.Recv()
		if err != nil {
			return err
		}
		// As the service: these belong to the first request only.
		if req.GetMaxOutstandingMessages() != 0 || req.GetMaxOutstandingBytes() != 0 || req.GetProtocolVersion() != 0 {
			return invalid("max_outstanding_messages, max_outstanding_bytes and protocol_version can only be set on the first request of a stream")
		}
		confirm, err := st.apply(req)
		if err != nil {
			return err
		}
		if confirm != nil {
			if err := st.respond(confirm); err != nil {
				return err
			}
			continue
		}
		if len(req.GetAckIds()) == 0 && len(req.GetModifyDeadlineAckIds()) == 0 {
			// A keepalive ping: protocol_version >= 1 clients close the
			// stream unless it is answered.
			if err := st.send(nil); err != nil {
				return err
			}
		}
	}
}

// apply carries out a request's acks, deadline changes and a new stream
// deadline. Every ack id is checked first: one bad id fails the request
// and nothing of it is applied. On an exactly-once subscription it returns
// the response that confirms the acks and deadline changes (nil for a
// request with neither), once JetStream has confirmed the acks.
func (st *pullStream) apply(req *pb.StreamingPullRequest) (*pb.StreamingPullResponse, error) {
	if req.GetStreamAckDeadlineSeconds() != 0 {
		d, err := streamDeadline(req.GetStreamAckDeadlineSeconds())
		if err != nil {
			return nil, err
		}
		st.deadline.Store(int64(d))
	}
	if len(req.GetModifyDeadlineSeconds()) != len(req.GetModifyDeadlineAckIds()) {
		return nil, invalid("modify_deadline_seconds has %d entries and modify_deadline_ack_ids %d: they must match",
			len(req.GetModifyDeadlineSeconds()), len(req.GetModifyDeadlineAckIds()))
	}
	for _, secs := range req.GetModifyDeadlineSeconds() {
		if secs < 0 || secs > maxAckDeadlineSeconds {
			return nil, invalid("modify deadline %d not in 0..%d seconds", secs, maxAckDeadlineSeconds)
		}
	}
	acks, refusedAck := st.s.parseAckIDs(st.d.name, req.GetAckIds())
	mods, refusedMod := st.s.parseAckIDs(st.d.name, req.GetModifyDeadlineAckIds())
	eod := st.d.cfg.Load().ExactlyOnce
	ctx := st.stream.Context()
	ackRes := settleAll(len(acks), eod, func(i int) ackResult { return st.d.ack(ctx, acks[i], eod) })
	modRes := settleAll(len(mods), false, func(i int) ackResult { return st.d.modify(mods[i], req.GetModifyDeadlineSeconds()[i]) })
	// The others are applied: now a refused ack id ends the stream.
	if refusedAck != nil {
		return nil, refusedAck
	}
	if refusedMod != nil {
		return nil, refusedMod
	}
	if !eod || len(acks)+len(mods) == 0 {
		return nil, nil
	}
	resp := &pb.StreamingPullResponse{}
	if len(acks) > 0 {
		ok, bad, retry := sortResults(req.GetAckIds(), ackRes)
		resp.AcknowledgeConfirmation = &pb.StreamingPullResponse_AcknowledgeConfirmation{AckIds: ok, InvalidAckIds: bad, TemporaryFailedAckIds: retry}
	}
	if len(mods) > 0 {
		ok, bad, retry := sortResults(req.GetModifyDeadlineAckIds(), modRes)
		resp.ModifyAckDeadlineConfirmation = &pb.StreamingPullResponse_ModifyAckDeadlineConfirmation{AckIds: ok, InvalidAckIds: bad, TemporaryFailedAckIds: retry}
	}
	return resp, nil
}

// sortResults splits ack ids by their results.
func sortResults(ackIDs []string, res []ackResult) (ok, invalid, transient []string) {
	for i, r := range res {
		switch r {
		case ackOK:
			ok = append(ok, ackIDs[i])
		case ackInvalid:
			invalid = append(invalid, ackIDs[i])
		case ackTransient:
			transient = append(transient, ackIDs[i])
		}
	}
	return ok, invalid, transient
}

// send sends a batch of messages (none: an empty response).
func (st *pullStream) send(batch []*pb.ReceivedMessage) error {
	return st.respond(&pb.StreamingPullResponse{ReceivedMessages: batch})
}

// respond sends resp (nil: an empty response) with the subscription's
// properties, as every response carries them.
func (st *pullStream) respond(resp *pb.StreamingPullResponse) error {
	if resp == nil {
		resp = &pb.StreamingPullResponse{}
	}
	resp.SubscriptionProperties = &pb.StreamingPullResponse_SubscriptionProperties{
		MessageOrderingEnabled: st.d.ordering,
		// Read at each response: UpdateSubscription may turn it on or off,
		// and the Go client follows what the last response said.
		ExactlyOnceDeliveryEnabled: st.d.cfg.Load().ExactlyOnce,
	}
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if st.ended {
		return io.ErrClosedPipe // the RPC has returned: the stream is not ours to use
	}
	return st.stream.Send(resp)
}

// ack acks what ref names: a lease of this process, on an exactly-once
// subscription (eod) once JetStream has confirmed it (ackConfirmed),
// otherwise at once; or a message named by an earlier process's ack id
// (ackStale).
func (d *dispatcher) ack(ctx context.Context, ref ackRef, eod bool) ackResult {
	switch {
	case ref.epoch == 0: // refused
		return ackInvalid
	case !d.s.own(ref):
		return d.ackStale(ctx, ref.seq, eod)
	case eod:
		return d.ackConfirmed(ctx, ref.lease)
	case !d.settle(ref.lease, outAck):
		return ackInvalid
	}
	return ackOK
}

// ackStale honours an ack of message seq through an ack id of an earlier
// process: the lease that holds the message now is acked. Without one the
// message is acked when it is delivered again (staleAcks), except on an
// exactly-once subscription, where an ack must be confirmed: the ack id is
// invalid there.
func (d *dispatcher) ackStale(ctx context.Context, seq uint64, eod bool) ackResult {
	d.mu.Lock()
	var lease uint64
	for id, l := range d.leases {
		if l.msg.StreamSequence == seq {
			lease = id
			break
		}
	}
	d.mu.Unlock()
	if lease != 0 {
		res := d.ack(ctx, ackRef{epoch: d.s.epoch, lease: lease}, eod)
		if res == ackOK {
			d.s.b.Metrics.StaleAcks.Inc()
		}
		return res
	}
	if eod {
		return ackInvalid
	}
	d.s.stale.add(d.name, seq)
	return ackOK
}

// modify nacks the lease ref names for 0 seconds, and otherwise moves its
// deadline. Neither waits, with exactly-once delivery too: a nack needs no
// confirmation (a nack lost on the way lets the deadline pass instead).
// An earlier process's ack id names no lease here: its message is
// delivered again anyway.
func (d *dispatcher) modify(ref ackRef, secs int32) ackResult {
	if !d.s.own(ref) {
		return ackInvalid
	}
	var ok bool
	if secs == 0 {
		ok = d.settle(ref.lease, outNack)
	} else {
		ok = d.extend(ref.lease, time.Duration(secs)*time.Second)
	}
	if !ok {
		return ackInvalid
	}
	return ackOK
}

// maxConfirming bounds the exactly-once acks of one request confirmed at
// once: each waits a round trip to JetStream.
const maxConfirming = 64

// settleAll runs f for the ack ids 0..n-1 of a request and returns their
// results: one after another, or concurrently (at most maxConfirming at a
// time) when each waits for JetStream's confirmation.
func settleAll(n int, concurrent bool, f func(i int) ackResult) []ackResult {
	res := make([]ackResult, n)
	if !concurrent || n == 1 {
		for i := range n {
			res[i] = f(i)
		}
		return res
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConfirming)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res[i] = f(i)
		})
	}
	wg.Wait()
	return res
}

// Pull returns up to max_messages messages, waiting up to PullWait for the
// first one; it returns an empty response when none comes.
func (s *Server) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullResponse, error) {
	project, id, err := parseSubscription(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	if req.GetMaxMessages() <= 0 {
		return nil, invalid("max_messages must be positive, got %d", req.GetMaxMessages())
	}
	d, err := s.attach(ctx, project, id)
	if err != nil {
		return nil, err
	}
	defer d.detach()
	s.activity.touch(d.name)
	if d.push.Load() != nil {
		return nil, errPushSubscription
	}
	wait := s.cfg.PullWait
	if req.GetReturnImmediately() {
		wait = 50 * time.Millisecond // a moment for a message already waiting in a handler
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	resp := &pb.PullResponse{}
	var l *lease
	select {
	case l = <-d.ready:
	case <-t.C:
		return resp, nil
	case <-d.draining:
		return resp, nil
	case <-d.done:
		return nil, d.endErr()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if ctx.Err() != nil {
		d.refuse(l) // the caller is gone: do not lease what it cannot get
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	resp.ReceivedMessages, _ = d.leaseBatch(l, nil, d.ackDeadline(), int(min(req.GetMaxMessages(), maxBatchMessages)))
	return resp, nil
}

// leaseBatch leases l and whatever else is ready at once, up to max
// messages, maxBatchBytes and the stream's flow control, and returns them
// with their lease ids, for the stream st (nil for a Pull call). Messages
// lease refuses (handing out has stopped) are left out.
func (d *dispatcher) leaseBatch(l *lease, st *pullStream, deadline time.Duration, max int) ([]*pb.ReceivedMessage, []uint64) {
	var batch []*pb.ReceivedMessage
	var ids []uint64
	var f *flow
	var own chan *lease // nil for a Pull call: never ready
	if st != nil {
		f, own = st.flow, st.own
	}
	bytes := 0
	for l != nil {
		if rm := d.lease(l, st, f, deadline); rm != nil {
			batch, ids = append(batch, rm), append(ids, l.id)
			bytes += l.size
		}
		l = nil
		if len(batch) < max && bytes < maxBatchBytes && (f == nil || f.room()) {
			select {
			case l = <-d.ready:
			case l = <-own:
			default:
			}
		}
	}
	return batch, ids
}

// Acknowledge acks messages. Each ack id is applied on its own: ack ids of
// leases that have ended are ignored, as in Pub/Sub; those of an earlier
// process are honoured (ackid.go); one the sidecars did not issue for the
// subscription fails the request once the others are applied. On an
// exactly-once subscription it returns once JetStream has confirmed the
// acks, and reports ack ids that failed as the service does
// (exactlyOnceError).
func (s *Server) Acknowledge(ctx context.Context, req *pb.AcknowledgeRequest) (*emptypb.Empty, error) {
	err := s.forLeases(ctx, req.GetSubscription(), req.GetAckIds(), true, func(d *dispatcher, ref ackRef, eod bool) ackResult {
		return d.ack(ctx, ref, eod)
	})
	if err != nil {
		return nil, err
	}
	s.activity.touch(req.GetSubscription())
	return &emptypb.Empty{}, nil
}

// ModifyAckDeadline extends leases by ack_deadline_seconds from now, or
// nacks them for 0: they are redelivered at once, before anything later of
// their ordering keys.
func (s *Server) ModifyAckDeadline(ctx context.Context, req *pb.ModifyAckDeadlineRequest) (*emptypb.Empty, error) {
	secs := req.GetAckDeadlineSeconds()
	if secs < 0 || secs > maxAckDeadlineSeconds {
		return nil, invalid("ack_deadline_seconds %d not in 0..%d", secs, maxAckDeadlineSeconds)
	}
	err := s.forLeases(ctx, req.GetSubscription(), req.GetAckIds(), false, func(d *dispatcher, ref ackRef, _ bool) ackResult {
		return d.modify(ref, secs)
	})
	if err != nil {
		return nil, err
	}
	s.activity.touch(req.GetSubscription())
	return &emptypb.Empty{}, nil
}

// forLeases calls f for what each ack id names (with whether the
// subscription has exactly-once delivery; concurrently when it has and
// acks says f waits for JetStream). Without a running dispatcher no lease
// of the subscription is out here, unless the subscription does not
// exist: NOT_FOUND; acks of an earlier process's ack ids are kept for
// the messages' redelivery then.
//
// Without exactly-once delivery ack ids of leases that have ended are
// ignored, as in Pub/Sub, and ack ids refused fail the call once the
// others are applied. With it, each ack id that failed is reported
// (exactlyOnceError).
func (s *Server) forLeases(ctx context.Context, sub string, ackIDs []string, acks bool, f func(d *dispatcher, ref ackRef, eod bool) ackResult) error {
	if _, _, err := parseSubscription(sub); err != nil {
		return err
	}
	if len(ackIDs) == 0 {
		return invalid("%s: no ack ids", sub)
	}
	refs, refused := s.parseAckIDs(sub, ackIDs)
	s.mu.Lock()
	d := s.dispatchers[sub]
	s.mu.Unlock()
	if d == nil {
		handle, err := s.subscriptionOf(sub)
		if err != nil {
			return err
		}
		cfg, err := handle.Config(ctx)
		if err != nil {
			return toStatus(err)
		}
		if !cfg.ExactlyOnce {
			for _, ref := range refs {
				if acks && ref.epoch != 0 && !s.own(ref) {
					s.stale.add(sub, ref.seq)
				}
			}
			return refused
		}
		res := make([]ackResult, len(refs))
		for i := range res {
			res[i] = ackInvalid
		}
		return exactlyOnceError(ackIDs, res)
	}
	eod := d.cfg.Load().ExactlyOnce
	res := settleAll(len(refs), eod && acks, func(i int) ackResult { return f(d, refs[i], eod) })
	if !eod {
		return refused
	}
	return exactlyOnceError(ackIDs, res) // refused ack ids are among those reported invalid
}

// Exactly-once delivery reports the ack ids of an Acknowledge or
// ModifyAckDeadline that failed as the service does, and as clients read
// them (the Go client's iterator.go, processResults): INVALID_ARGUMENT with
// a google.rpc.ErrorInfo whose reason is EXACTLY_ONCE_ACKID_FAILURE and
// whose metadata maps each failed ack id to PERMANENT_FAILURE_INVALID_ACK_ID
// (the lease has ended: AcknowledgeStatusInvalidAckID) or to a value with
// the prefix TRANSIENT_ (clients send those again).
const (
	eodReason          = "EXACTLY_ONCE_ACKID_FAILURE"
	eodDomain          = "pubsub.googleapis.com"
	eodInvalidAckID    = "PERMANENT_FAILURE_INVALID_ACK_ID"
	eodTransientFailed = "TRANSIENT_FAILURE_OTHER"
	eodFailureMessage  = "Some acknowledgement ids in the request were invalid. This could be because the acknowledgement ids have expired or the acknowledgement ids were malformed."
)

// exactlyOnceError is the error that reports the ack ids whose results
// are failures, or nil when none is.
func exactlyOnceError(ackIDs []string, res []ackResult) error {
	failed := map[string]string{}
	for i, r := range res {
		switch r {
		case ackInvalid:
			failed[ackIDs[i]] = eodInvalidAckID
		case ackTransient:
			failed[ackIDs[i]] = eodTransientFailed
		}
	}
	if len(failed) == 0 {
		return nil
	}
	st, err := status.New(codes.InvalidArgument, eodFailureMessage).
		WithDetails(&errdetails.ErrorInfo{Reason: eodReason, Domain: eodDomain, Metadata: failed})
	if err != nil { // only for a detail that cannot be marshalled
		return status.Errorf(codes.Internal, "exactly-once ack failure: %v", err)
	}
	return st.Err()
}

// Drain stops handing out messages and waits, until ctx ends, for the
// leases out to be settled; then Close hands back the rest.
func (s *Server) Drain(ctx context.Context) {
	ds := s.shut()
	for _, d := range ds {
		d.drain()
	}
	for _, d := range ds {
		select {
		case <-d.drained:
		case <-ctx.Done():
			return
		}
	}
}
