package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Hostile input to the sidecar: bytes that are not the protobuf they
// claim to be, gRPC frames cut short, requests that break a limit, HTTP
// bodies cut short or too large, and clients that would make the sidecar
// hold more than its bounds. Each is refused with a status that says what
// is wrong, and nothing is stored.

// rawCodec sends and receives messages as the bytes they are, so a
// test can put anything on the wire. It is named "proto" so the server
// decodes with its protobuf codec.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = bytes.Clone(data)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// largeResponses lets a gRPC connection accept responses of up to 32 MiB.
var largeResponses = grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(32 << 20))

// startHostile starts a sidecar with topic "hostile" and an ordered
// subscription "hostile-sub" of it, and clients of it that accept large
// responses.
func startHostile(t *testing.T, cfg sidecar.Config) (*itest.Sidecar, pb.PublisherClient, pb.SubscriberClient) {
	t.Helper()
	sc := itest.Start(t, cfg)
	pubc, subc := sc.RawClients(largeResponses)
	if _, err := pubc.CreateTopic(context.Background(), &pb.Topic{Name: topicPath("hostile")}); err != nil {
		t.Fatal(err)
	}
	if _, err := subc.CreateSubscription(context.Background(), &pb.Subscription{Name: subPath("hostile-sub"), Topic: topicPath("hostile"),
		EnableMessageOrdering: true, AckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	return sc, pubc, subc
}

// wantStatus fails unless err has code and its message contains
// text.
func wantStatus(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Errorf("%s: got %v, want %v containing %q", what, err, code, text)
	}
}

// topicCount is the number of topics in the test project.
func topicCount(t *testing.T, pubc pb.PublisherClient) int {
	t.Helper()
	resp, err := pubc.ListTopics(context.Background(), &pb.ListTopicsRequest{Project: "projects/" + project})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.GetTopics())
}

// Bytes that are not the protobuf message a method takes: every
// truncation of a valid request, wrong wire types, lengths past the end,
// strings that are not UTF-8. grpc-go refuses what does not decode with
// INTERNAL "grpc: failed to unmarshal the received message"; what decodes
// is a request missing its topic, messages or ack ids, refused with
// INVALID_ARGUMENT. Nothing is stored or created.
func TestHostileGRPCGarbageBytes(t *testing.T) {
	sc, pubc, subc := startHostile(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	conn := sc.Conn(largeResponses)
	ctx := context.Background()
	topicsBefore := topicCount(t, pubc)

	valid := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	str := func(b []byte, field protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, field, protowire.BytesType), s)
	}
	message := func(fields []byte) []byte { // PublishRequest.messages holding fields
		return protowire.AppendBytes(protowire.AppendTag(str(nil, 1, topicPath("hostile")), 2, protowire.BytesType), fields)
	}
	type call struct {
		method string
		body   []byte
		into   proto.Message // the request type, to tell what decodes
	}
	var calls []call
	add := func(method string, into proto.Message, body []byte) {
		calls = append(calls, call{method, body, into})
	}
	publish := valid(&pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{
		{Data: []byte("payload"), OrderingKey: "k", Attributes: map[string]string{"origin": "eu-west"}}}})
	for n := range len(publish) {
		add("/google.pubsub.v1.Publisher/Publish", &pb.PublishRequest{}, publish[:n])
	}
	// The name last, so that no prefix is a whole request.
	create := append(valid(&pb.Topic{MessageRetentionDuration: durationpb.New(time.Hour)}), valid(&pb.Topic{Name: topicPath("hostile-new")})...)
	for n := range len(create) {
		add("/google.pubsub.v1.Publisher/CreateTopic", &pb.Topic{}, create[:n])
	}
	for _, garbage := range [][]byte{
		{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},                                     // a length past the end
		{0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, // a varint of 11 bytes
		{0x12, 0x01},                          // messages: one byte promised, none there
		{0x17},                                // wire type 7 does not exist
		{0x00, 0x01},                          // field number 0
		str(nil, 1, topicPath("hostile\xff")), // topic not UTF-8
		message(str(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("x")), 5, "key-\xff")),   // ordering key not UTF-8
		message(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), str(str(nil, 1, "a\xc3"), 2, "v"))), // attribute key not UTF-8
		message([]byte{0x0a, 0x05, 'x'}), // data cut short inside its message
		message(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)),   // data as a number
		valid(&pb.Subscription{Name: subPath("hostile-sub"), Topic: topicPath("hostile")}),      // another message type
		[]byte(`{"topic":"projects/test-project/topics/hostile","messages":[{"data":"eA=="}]}`), // JSON, not protobuf
	} {
		add("/google.pubsub.v1.Publisher/Publish", &pb.PublishRequest{}, garbage)
	}
	add("/google.pubsub.v1.Subscriber/Acknowledge", &pb.AcknowledgeRequest{}, str(str(nil, 1, subPath("hostile-sub")), 4, "ack-\xff"))
	add("/google.pubsub.v1.Subscriber/CreateSubscription", &pb.Subscription{}, str(str(nil, 1, subPath("hostile-\xff")), 2, topicPath("hostile")))

	decoding, refused := 0, 0
	for _, c := range calls {
		var out []byte
		err := conn.Invoke(ctx, c.method, &c.body, &out, grpc.ForceCodec(rawCodec{}))
		what := fmt.Sprintf("%s with %q", c.method, c.body)
		if perr := proto.Unmarshal(c.body, c.into); perr != nil {
			refused++
			wantStatus(t, what, err, codes.Internal, "grpc: failed to unmarshal the received message")
		} else {
			decoding++
			wantStatus(t, what, err, codes.InvalidArgument, "")
		}
	}
	t.Logf("%d requests refused as undecodable, %d decoded and refused as invalid", refused, decoding)

	// StreamingPull: garbage as the first request, and after a valid one.
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	for _, first := range [][]byte{{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, str(nil, 1, subPath("hostile-sub\xff"))} {
		s, err := conn.NewStream(ctx, desc, "/google.pubsub.v1.Subscriber/StreamingPull", grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(&first); err != nil {
			t.Fatal(err)
		}
		var out []byte
		wantStatus(t, fmt.Sprintf("StreamingPull first request %q", first), s.RecvMsg(&out), codes.Internal, "grpc: failed to unmarshal the received message")
	}
	s, err := conn.NewStream(ctx, desc, "/google.pubsub.v1.Subscriber/StreamingPull", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	first := valid(&pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 60})
	var out []byte
	if err := s.SendMsg(&first); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(&out); err != nil {
		t.Fatalf("first StreamingPull response: %v", err)
	}
	garbage := []byte{0x12, 0x05, 'a'}
	if err := s.SendMsg(&garbage); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "StreamingPull garbage second request", s.RecvMsg(&out), codes.Internal, "grpc: failed to unmarshal the received message")

	assertStored(t, js, project, "hostile", 0)
	if got := topicCount(t, pubc); got != topicsBefore {
		t.Fatalf("%d topics after garbage requests, %d before", got, topicsBefore)
	}
	if subs, err := subc.ListSubscriptions(ctx, &pb.ListSubscriptionsRequest{Project: "projects/" + project}); err != nil || len(subs.GetSubscriptions()) != 1 {
		t.Fatalf("subscriptions after garbage requests: %v, %v; want hostile-sub alone", subs.GetSubscriptions(), err)
	}
}

// sendFrame sends frame as the whole body of one gRPC call on its own
// HTTP/2 stream and returns the grpc-status and grpc-message the server
// answers with.
func sendFrame(t *testing.T, addr, method string, frame []byte) (codes.Code, string) {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true) // prior knowledge, as gRPC does
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+method, bytes.NewReader(frame))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := (&http.Client{Transport: tr, Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string {
		if v := resp.Trailer.Get(name); v != "" {
			return v
		}
		return resp.Header.Get(name) // a trailers-only response
	}
	code, err := strconv.Atoi(get("Grpc-Status"))
	if err != nil {
		t.Fatalf("%s: no grpc-status in the answer (HTTP %d)", method, resp.StatusCode)
	}
	msg, err := url.PathUnescape(get("Grpc-Message"))
	if err != nil {
		t.Fatal(err)
	}
	return codes.Code(code), msg
}

// lengthPrefixed is body after a gRPC message prefix: flag, then length.
func lengthPrefixed(flag byte, length int, body []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{flag}, uint32(length)), body...)
}

// gRPC frames cut short or lying about their size, sent on a raw HTTP/2
// stream: a message prefix promising more bytes than the stream carries, a
// prefix cut short, one promising more than the server's 12 MiB limit
// (refused before anything is read), a compressed flag without an
// encoding, an unknown flag. Each gets the status grpc-go gives, and
// nothing is stored; the same request framed right is published.
func TestHostileGRPCTruncatedFrames(t *testing.T) {
	sc, _, _ := startHostile(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	publish, err := proto.Marshal(&pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: []byte("payload"), OrderingKey: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	const method = "/google.pubsub.v1.Publisher/Publish"
	for _, tc := range []struct {
		name  string
		frame []byte
		code  codes.Code
		msg   string
	}{
		{"body shorter than its prefix says", lengthPrefixed(0, len(publish), publish[:len(publish)-3]), codes.Internal, "unexpected EOF"},
		{"prefix says one byte more", lengthPrefixed(0, len(publish)+1, publish), codes.Internal, "unexpected EOF"},
		{"prefix cut short", []byte{0, 0, 0}, codes.Internal, "unexpected EOF"},
		{"over the 12 MiB limit, nothing sent", lengthPrefixed(0, 1<<30, nil), codes.ResourceExhausted, "grpc: received message larger than max (1073741824 vs. 12582912)"},
		{"just over the 12 MiB limit", lengthPrefixed(0, 12<<20+1, publish), codes.ResourceExhausted, "grpc: received message larger than max (12582913 vs. 12582912)"},
		{"compressed without an encoding", lengthPrefixed(1, len(publish), publish), codes.Internal, "grpc: compressed flag set with identity or empty encoding"},
		{"a flag that is not 0 or 1", lengthPrefixed(7, len(publish), publish), codes.Internal, "grpc: received unexpected payload format 7"},
	} {
		if code, msg := sendFrame(t, sc.GRPC, method, tc.frame); code != tc.code || msg != tc.msg {
			t.Errorf("%s: %v %q, want %v %q", tc.name, code, msg, tc.code, tc.msg)
		}
	}
	assertStored(t, js, project, "hostile", 0)
	if code, msg := sendFrame(t, sc.GRPC, method, lengthPrefixed(0, len(publish), publish)); code != codes.OK {
		t.Fatalf("the request framed right: %v %q", code, msg)
	}
	assertStored(t, js, project, "hostile", 1)
}

// Requests that decode but break a rule, beyond TestSidecarBadRequests:
// names, keys, sizes, counts, deadlines and ack ids. Each gets its status
// and message; none stores or creates anything.
func TestHostileGRPCRequests(t *testing.T) {
	sc, pubc, subc := startHostile(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	ctx := context.Background()
	topicsBefore := topicCount(t, pubc)
	msg := func(data string) *pb.PubsubMessage { return &pb.PubsubMessage{Data: []byte(data)} }
	pub := func(msgs ...*pb.PubsubMessage) error {
		_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: msgs})
		return err
	}
	manyAttrs := map[string]string{}
	for i := range 101 {
		manyAttrs[fmt.Sprint("a", i)] = "v"
	}
	thousandAndOne := make([]*pb.PubsubMessage, 1001)
	for i := range thousandAndOne {
		thousandAndOne[i] = msg("x")
	}
	chunk := make([]byte, 3584<<10) // 3.5 MiB: three are over 10 MiB, under 12 MiB
	streamErr := func(reqs ...*pb.StreamingPullRequest) error {
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second) // a stream the server keeps open fails as DEADLINE_EXCEEDED
		defer cancel()
		s, err := subc.StreamingPull(sctx)
		if err != nil {
			return err
		}
		for _, r := range reqs {
			if err := s.Send(r); err != nil {
				break // the server ended the stream: Recv tells why
			}
		}
		for {
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
	}
	first := &pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 60}
	longAckID := strings.Repeat("A", 1<<20)

	cases := []struct {
		name string
		err  error
		code codes.Code
		text string
	}{
		{"topic name with NUL", func() error {
			_, err := pubc.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("hos\x00tile")})
			return err
		}(),
			codes.InvalidArgument, `invalid topic name "projects/test-project/topics/hos\x00tile"`},
		{"topic name with a wildcard", func() error {
			_, err := pubc.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("hostile.>")})
			return err
		}(),
			codes.InvalidArgument, "may contain only letters, digits and - _ . ~ + %"},
		{"publish to a name with spaces", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hos tile"), Messages: []*pb.PubsubMessage{msg("x")}})
			return err
		}(), codes.InvalidArgument, "invalid topic name"},
		{"project with a wildcard", func() error {
			_, err := pubc.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/a*"})
			return err
		}(),
			codes.InvalidArgument, "invalid project name"},
		{"1001 messages", pub(thousandAndOne...), codes.InvalidArgument, "publish to projects/test-project/topics/hostile: 1001 messages in one request, at most 1000"},
		{"101 attributes", pub(&pb.PubsubMessage{Data: []byte("x"), Attributes: manyAttrs}), codes.InvalidArgument, "101 attributes, at most 100"},
		{"attribute key of 257 bytes", pub(&pb.PubsubMessage{Data: []byte("x"), Attributes: map[string]string{strings.Repeat("k", 257): "v"}}),
			codes.InvalidArgument, "longer than 256 bytes"},
		{"attribute value of 1025 bytes", pub(&pb.PubsubMessage{Data: []byte("x"), Attributes: map[string]string{"k": strings.Repeat("v", 1025)}}),
			codes.InvalidArgument, `attribute "k" value longer than 1024 bytes`},
		{"empty attribute key", pub(&pb.PubsubMessage{Data: []byte("x"), Attributes: map[string]string{"": "v"}}), codes.InvalidArgument, "empty attribute key"},
		{"request over 10 MiB", pub(&pb.PubsubMessage{Data: chunk}, &pb.PubsubMessage{Data: chunk}, &pb.PubsubMessage{Data: chunk}),
			codes.InvalidArgument, "publish to projects/test-project/topics/hostile: the request is larger than 10485760 bytes"},
		{"good message, then an oversized key", pub(&pb.PubsubMessage{Data: []byte("x"), OrderingKey: "k"}, &pb.PubsubMessage{Data: []byte("y"), OrderingKey: strings.Repeat("é", 513)}),
			codes.InvalidArgument, "messages[1]: Ordering key exceeds maximum length of 1024 bytes"},
		{"negative retention", func() error {
			_, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("hostile-2"), MessageRetentionDuration: durationpb.New(-time.Hour)})
			return err
		}(), codes.InvalidArgument, "invalid message_retention_duration"},
		{"retention out of range", func() error {
			_, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("hostile-3"), MessageRetentionDuration: &durationpb.Duration{Seconds: 1, Nanos: -5}})
			return err
		}(), codes.InvalidArgument, "invalid message_retention_duration"},
		{"negative page size", func() error {
			_, err := pubc.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/" + project, PageSize: -1})
			return err
		}(), codes.InvalidArgument, "page_size -1 is negative"},
		{"dead-letter topic name", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("hostile-dl"), Topic: topicPath("hostile"),
				DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: "projects/test-project/topics/a>"}})
			return err
		}(), codes.InvalidArgument, "invalid topic name"},
		{"dead-letter attempts", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("hostile-dl"), Topic: topicPath("hostile"),
				DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath("hostile"), MaxDeliveryAttempts: 101}})
			return err
		}(), codes.InvalidArgument, "invalid configuration"},
		{"negative ack deadline", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("hostile-neg"), Topic: topicPath("hostile"), AckDeadlineSeconds: -1})
			return err
		}(), codes.InvalidArgument, "ack_deadline_seconds -1 not in 0..600"},
		{"update of an unknown field", func() error {
			_, err := subc.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{Subscription: &pb.Subscription{Name: subPath("hostile-sub")}, UpdateMask: fieldMask("no_such_field")})
			return err
		}(), codes.InvalidArgument, `unknown field name "no_such_field"`},
		{"acknowledge nothing", func() error {
			_, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-sub")})
			return err
		}(), codes.InvalidArgument, "no ack ids"},
		{"acknowledge a 1 MiB ack id", func() error {
			_, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-sub"), AckIds: []string{longAckID}})
			return err
		}(), codes.InvalidArgument, "invalid ack id"},
		{"acknowledge on a subscription name with a wildcard", func() error {
			_, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-*"), AckIds: []string{"x"}})
			return err
		}(), codes.InvalidArgument, "invalid subscription name"},
		{"negative modify deadline", func() error {
			_, err := subc.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: subPath("hostile-sub"), AckIds: []string{"x"}, AckDeadlineSeconds: -1})
			return err
		}(), codes.InvalidArgument, "ack_deadline_seconds -1 not in 0..600"},
		{"pull a negative count", func() error {
			_, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("hostile-sub"), MaxMessages: -1})
			return err
		}(), codes.InvalidArgument, "max_messages must be positive, got -1"},
		{"stream: forged ack id in the first request", streamErr(&pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), AckIds: []string{"forged"}}),
			codes.InvalidArgument, "invalid ack id"},
		{"stream: ack deadline over 600", streamErr(&pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 601}),
			codes.InvalidArgument, "stream_ack_deadline_seconds 601 not in 0..600"},
		{"stream: flow control on a later request", streamErr(first, &pb.StreamingPullRequest{MaxOutstandingMessages: 5}),
			codes.InvalidArgument, "can only be set on the first request"},
		{"stream: modify lists of different lengths", streamErr(first, &pb.StreamingPullRequest{ModifyDeadlineAckIds: []string{"a", "b"}, ModifyDeadlineSeconds: []int32{10}}),
			codes.InvalidArgument, "modify_deadline_seconds has 1 entries and modify_deadline_ack_ids 2"},
		{"stream: modify deadline over 600", streamErr(first, &pb.StreamingPullRequest{ModifyDeadlineAckIds: []string{"a"}, ModifyDeadlineSeconds: []int32{601}}),
			codes.InvalidArgument, "modify deadline 601 not in 0..600 seconds"},
		{"stream: new ack deadline out of range", streamErr(first, &pb.StreamingPullRequest{StreamAckDeadlineSeconds: -5}),
			codes.InvalidArgument, "stream_ack_deadline_seconds -5 not in 0..600"},
		{"stream: forged ack id later", streamErr(first, &pb.StreamingPullRequest{AckIds: []string{longAckID}}),
			codes.InvalidArgument, "invalid ack id"},
		{"stream: subscription name with a NUL", streamErr(&pb.StreamingPullRequest{Subscription: subPath("hostile\x00sub")}),
			codes.InvalidArgument, "invalid subscription name"},
	}
	for _, tc := range cases {
		wantStatus(t, tc.name, tc.err, tc.code, tc.text)
	}

	assertStored(t, js, project, "hostile", 0)
	if got := topicCount(t, pubc); got != topicsBefore {
		t.Fatalf("%d topics after refused requests, %d before", got, topicsBefore)
	}
	for _, s := range []string{"hostile-dl", "hostile-neg"} {
		if _, err := subc.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(s)}); status.Code(err) != codes.NotFound {
			t.Fatalf("subscription %s exists after a refused create: %v", s, err)
		}
	}
}

// Message sizes, on a NATS server of its own whose max_payload is 8 MiB
// (a cluster the sidecar is pointed at may have less than the embedded
// server's): a 5 MB message, over grpc-go's default 4 MiB limit, is
// published through gRPC and through HTTP, and delivered whole; a request
// over Pub/Sub's 10 MiB is refused by the sidecar, one over the gRPC
// server's 12 MiB by grpc-go (RESOURCE_EXHAUSTED), and a message over the
// NATS server's max_payload, by its data or by its data and headers
// together, as invalid; none of those stores anything, and the key goes
// on.
func TestHostileMessageSizes(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{StoreDir: t.TempDir(), Port: -1, Configure: func(o *server.Options) { o.MaxPayload = 8 << 20 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	sc, pubc, subc := startHostile(t, sidecar.Config{NATSURL: srv.ClientURL()})
	js, err := jetstream.New(testutil.Connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big := make([]byte, 5_000_000)
	_, _ = rand.Read(big)
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: big, OrderingKey: "big"}}}); err != nil {
		t.Fatalf("gRPC publish of 5 MB: %v", err)
	}
	body := fmt.Sprintf(`{"messages":[{"data":%q,"orderingKey":"big"}]}`, b64(big[:4_000_000]))
	if code, msg := postJSON(t, "http://"+sc.HTTP+"/v1/projects/"+project+"/topics/hostile:publish", body); code != http.StatusOK {
		t.Fatalf("HTTP publish of 4 MB (a %d-byte body): %d %s", len(body), code, msg)
	}

	half := make([]byte, 6<<20+512<<10) // two: 13 MiB, over the gRPC limit
	_, err = pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: half}, {Data: half}}})
	wantStatus(t, "13 MiB request", err, codes.ResourceExhausted, "grpc: received message larger than max")
	third := make([]byte, 3584<<10)
	_, err = pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: third}, {Data: third}, {Data: third}}})
	wantStatus(t, "10.5 MiB request", err, codes.InvalidArgument, "the request is larger than 10485760 bytes")
	// 8 MiB of max_payload, less 512 bytes kept for the identity headers.
	const limit = "exceeds the server's limit of 8388096 bytes"
	_, err = pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: make([]byte, 8<<20-400)}}})
	wantStatus(t, "a message over max_payload", err, codes.InvalidArgument, limit)
	// Data within the limit, but attributes that take three bytes a byte
	// in headers push the whole message over max_payload. The request's
	// first message is fine, and is not stored either.
	escaped := map[string]string{}
	for i := range 20 {
		escaped[fmt.Sprint("a", i)] = strings.Repeat("\x01", 1024)
	}
	_, err = pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{
		{Data: []byte("fine"), OrderingKey: "big"}, {Data: make([]byte, 8<<20-16<<10), Attributes: escaped, OrderingKey: "big"}}})
	wantStatus(t, "data and headers over max_payload", err, codes.InvalidArgument, "messages[1]: invalid message: message of ")
	req, err := http.NewRequest(http.MethodPost, "http://"+sc.HTTP+"/v1/projects/"+project+"/topics/hostile/events", bytes.NewReader(make([]byte, 8<<20-16<<10)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = http.Header{"Content-Type": {"application/octet-stream"}, "Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"/s"}, "Ce-Type": {"t"},
		"Ce-Note": {strings.Repeat("%01", 20<<10)}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if msg := errorMessage(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, limit) {
		t.Errorf("HTTP event with data and headers over max_payload: %d %q", resp.StatusCode, msg)
	}
	resp.Body.Close()

	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 60})
	m := rs.next()
	if !bytes.Equal(m.GetMessage().GetData(), big) {
		t.Fatalf("first delivery: %d bytes, not the 5 MB published", len(m.GetMessage().GetData()))
	}
	if _, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-sub"), AckIds: []string{m.GetAckId()}}); err != nil {
		t.Fatal(err)
	}
	m = rs.next()
	if !bytes.Equal(m.GetMessage().GetData(), big[:4_000_000]) {
		t.Fatalf("second delivery: %d bytes, not the 4 MB published over HTTP", len(m.GetMessage().GetData()))
	}
	if _, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-sub"), AckIds: []string{m.GetAckId()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: []*pb.PubsubMessage{{Data: []byte("after"), OrderingKey: "big"}}}); err != nil {
		t.Fatalf("publish on the key after the refusals: %v", err)
	}
	if m := rs.next(); string(m.GetMessage().GetData()) != "after" {
		t.Fatalf("third delivery: %d bytes, want the message published after the refusals", len(m.GetMessage().GetData()))
	}
	assertStored(t, js, project, "hostile", 3)
}

// waitMetric polls /metrics until the series of name, summed over
// their labels, come to want.
func waitMetric(t *testing.T, sc *itest.Sidecar, name string, want int) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() bool {
		m, err := testutil.ScrapeErr("http://" + sc.HTTP + "/metrics")
		return err == nil && m.Sum(name) == float64(want)
	}, "metric %s never %d", name, want)
}

// StreamingPull bounds: streams count from the moment they open, so
// streams that never send a request cannot pile up past --max-streams
// (RESOURCE_EXHAUSTED, with the limit in the message); a stream's
// max_outstanding_bytes bounds what it is handed, but a message larger
// than the bound still comes when nothing is outstanding; and
// --max-outstanding-messages bounds what one subscription makes the
// sidecar hold, whatever the client asks for.
func TestHostileStreamingPullBounds(t *testing.T) {
	sc, pubc, subc := startHostile(t, sidecar.Config{MaxStreams: 2, MaxOutstandingMessages: 4})
	ctx := context.Background()

	// Two streams that never send anything fill the limit.
	var idle []context.CancelFunc
	for range 2 {
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		if _, err := subc.StreamingPull(sctx); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, cancel)
	}
	waitMetric(t, sc, "jetorder_streaming_pull_streams", 2)
	// The refusal may end the stream before its first request is sent:
	// Send then fails with io.EOF, and Recv has the status.
	third, cancelThird := context.WithTimeout(ctx, 15*time.Second)
	defer cancelThird()
	stream, err := subc.StreamingPull(third)
	if err == nil {
		err = stream.Send(&pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 60})
	}
	if err == nil || errors.Is(err, io.EOF) {
		_, err = stream.Recv()
	}
	wantStatus(t, "a third stream", err, codes.ResourceExhausted, "too many StreamingPull streams (at most 2)")
	idle[0]()
	waitMetric(t, sc, "jetorder_streaming_pull_streams", 1)

	// Per stream: 1000-byte messages (1036 with the id) against 2500
	// bytes: three are handed out, the third crossing the bound.
	if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("hostile-flow")}); err != nil {
		t.Fatal(err)
	}
	if _, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("hostile-flow-sub"), Topic: topicPath("hostile-flow"), AckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	var msgs []*pb.PubsubMessage
	for range 5 {
		msgs = append(msgs, &pb.PubsubMessage{Data: make([]byte, 1000)})
	}
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile-flow"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	flow := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("hostile-flow-sub"), StreamAckDeadlineSeconds: 60, MaxOutstandingBytes: 2500})
	var held []string
	for range 3 {
		held = append(held, flow.next().GetAckId())
	}
	flow.quiet(300*time.Millisecond, "a fourth message past max_outstanding_bytes 2500")
	ack := func(ids ...string) {
		t.Helper()
		if _, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-flow-sub"), AckIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	ack(held[0])
	held = append(held[1:], flow.next().GetAckId())
	flow.quiet(300*time.Millisecond, "more than 2500 bytes outstanding after one ack")
	ack(held...)
	held = []string{flow.next().GetAckId()} // the fifth
	ack(held...)
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile-flow"), Messages: []*pb.PubsubMessage{{Data: make([]byte, 5000)}}}); err != nil {
		t.Fatal(err)
	}
	if m := flow.next(); len(m.GetMessage().GetData()) != 5000 {
		t.Fatalf("got %d bytes, want the 5000-byte message larger than the bound", len(m.GetMessage().GetData()))
	}
	flow.stream.CloseSend()
	idle[1]()

	// Per subscription: a client that sets no flow control gets at most
	// --max-outstanding-messages (4) at once, on all its streams and Pull
	// calls together.
	msgs = nil
	for i := range 10 {
		msgs = append(msgs, &pb.PubsubMessage{Data: []byte(fmt.Sprint(i))})
	}
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("hostile"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, sc, "jetorder_streaming_pull_streams", 0)
	greedy := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("hostile-sub"), StreamAckDeadlineSeconds: 60})
	held = nil
	for range 4 {
		held = append(held, greedy.next().GetAckId())
	}
	greedy.quiet(300*time.Millisecond, "a fifth message past --max-outstanding-messages 4")
	if resp, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("hostile-sub"), MaxMessages: 100, ReturnImmediately: true}); err != nil || len(resp.GetReceivedMessages()) != 0 {
		t.Fatalf("Pull beside a stream holding the limit: %d messages, %v; want none", len(resp.GetReceivedMessages()), err)
	}
	if _, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("hostile-sub"), AckIds: held[:2]}); err != nil {
		t.Fatal(err)
	}
	greedy.next()
	greedy.next()
	greedy.quiet(300*time.Millisecond, "more than 4 held after acking 2")
}

// rawHTTP writes req on a new connection, closes the writing side
// and returns the answer's status and error message.
func rawHTTP(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to %.80q: %v", req, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, errorMessage(t, resp)
}

// Truncated HTTP bodies: every prefix of a publish request and of a
// structured CloudEvent, bodies shorter than their Content-Length, chunked
// bodies cut off or malformed. Each is answered 400 with what is wrong,
// and nothing is stored.
func TestHostileHTTPTruncatedBodies(t *testing.T) {
	sc, _, _ := startHostile(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	base := "http://" + sc.HTTP + "/v1/projects/" + project + "/topics/hostile"
	publish := `{"messages": [{"data": "eyJhbW91bnQiOjEyMH0=", "attributes": {"origin": "eu-west"}, "orderingKey": "order-7"}, {"data": "c2Vjb25k", "orderingKey": "order-7"}]}`
	for n := range len(publish) {
		code, msg := postJSON(t, base+":publish", publish[:n])
		want := "invalid JSON: unexpected end of input"
		if n == 0 {
			want = "request body is empty"
		}
		if code != http.StatusBadRequest || msg != want {
			t.Fatalf("publish body cut at %d (%q): %d %q, want 400 %q", n, publish[:n], code, msg, want)
		}
	}
	event := `{"specversion": "1.0", "id": "order-7-paid", "source": "/payments", "type": "com.example.order.paid", "partitionkey": "order-7", "datacontenttype": "application/json", "data": {"amount": 120}}`
	for n := range len(event) {
		resp, err := http.Post(base+"/events", "application/cloudevents+json", strings.NewReader(event[:n]))
		if err != nil {
			t.Fatal(err)
		}
		msg := errorMessage(t, resp)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(msg, "invalid CloudEvent: ") {
			t.Fatalf("event body cut at %d (%q): %d %q, want 400 invalid CloudEvent", n, event[:n], resp.StatusCode, msg)
		}
	}

	head := func(path, contentType, framing string) string {
		return "POST /v1/projects/" + project + "/topics/hostile" + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: " + contentType + "\r\n" + framing + "\r\n"
	}
	for _, tc := range []struct {
		name, req, msg string
	}{
		{"publish shorter than Content-Length", head(":publish", "application/json", "Content-Length: 400\r\n") + publish,
			"request body truncated: it ended before its declared length"},
		{"event shorter than Content-Length", head("/events", "application/cloudevents+json", "Content-Length: 400\r\n") + event,
			"request body truncated: it ended before its declared length"},
		{"binary event shorter than Content-Length", head("/events", "text/plain", "Content-Length: 100\r\nCe-Specversion: 1.0\r\nCe-Id: 1\r\nCe-Source: /s\r\nCe-Type: t\r\n") + "hi",
			"request body truncated: it ended before its declared length"},
		{"chunked publish cut inside a chunk", head(":publish", "application/json", "Transfer-Encoding: chunked\r\n") + "64\r\n" + publish[:20],
			"request body truncated: it ended before its declared length"},
		{"chunked publish without its last chunk", head(":publish", "application/json", "Transfer-Encoding: chunked\r\n") + fmt.Sprintf("%x\r\n%s\r\n", len(publish), publish),
			"request body truncated: it ended before its declared length"},
		{"chunk size not hex", head(":publish", "application/json", "Transfer-Encoding: chunked\r\n") + "zz\r\n" + publish,
			"reading the request body: "},
	} {
		code, msg := rawHTTP(t, sc.HTTP, tc.req)
		if code != http.StatusBadRequest || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %q, want 400 %q", tc.name, code, msg, tc.msg)
		}
	}
	assertStored(t, js, project, "hostile", 0)
}

// HTTP bounds: bodies over the 10 MiB limit, by Content-Length (refused
// before reading) or as they stream in, on both routes, answered 413; a
// structured event whose partitionkey is half a surrogate pair, 400; bad
// names in the path, 400. Nothing is stored. And a body announced but not
// sent costs the sidecar no memory in advance: sixteen requests that each
// declare 10 MiB, with the handlers already reading, grow its heap by far
// less than 160 MiB.
func TestHostileHTTPBounds(t *testing.T) {
	sc, _, _ := startHostile(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	js := sc.JetStream()
	base := "http://" + sc.HTTP + "/v1/projects/" + project + "/topics/"
	limit := httpapi.DefaultMaxBodyBytes
	over := fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", limit+1, limit)
	for _, tc := range []struct {
		name, req string
		code      int
		msg       string
	}{
		{"publish by Content-Length", fmt.Sprintf("POST /v1/projects/%s/topics/hostile:publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", project, limit+1),
			413, over},
		{"event by Content-Length", fmt.Sprintf("POST /v1/projects/%s/topics/hostile/events HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nCe-Specversion: 1.0\r\nCe-Id: 1\r\nCe-Source: /s\r\nCe-Type: t\r\nContent-Length: %d\r\n\r\n", project, limit+1),
			413, over},
	} {
		if code, msg := rawHTTP(t, sc.HTTP, tc.req); code != tc.code || msg != tc.msg {
			t.Errorf("%s: %d %q, want %d %q", tc.name, code, msg, tc.code, tc.msg)
		}
	}
	streamed := func(path string, header http.Header, prefix string) (int, string) {
		body := io.MultiReader(strings.NewReader(prefix), io.LimitReader(zeroReader{}, int64(limit)+1)) // no length: chunked
		req, err := http.NewRequest(http.MethodPost, base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, errorMessage(t, resp)
	}
	tooLarge := fmt.Sprintf("request body exceeds the limit of %d bytes", limit)
	if code, msg := streamed("hostile:publish", http.Header{"Content-Type": {"application/json"}}, `{"messages":[{"data":"`); code != 413 || msg != tooLarge {
		t.Errorf("streamed publish body over the limit: %d %q", code, msg)
	}
	if code, msg := streamed("hostile/events", http.Header{"Content-Type": {"text/plain"}, "Ce-Specversion": {"1.0"}, "Ce-Id": {"1"}, "Ce-Source": {"/s"}, "Ce-Type": {"t"}}, ""); code != 413 || msg != tooLarge {
		t.Errorf("streamed event body over the limit: %d %q", code, msg)
	}

	for _, tc := range []struct {
		name, path, contentType, body, msg string
	}{
		{"partitionkey half a surrogate pair", "hostile/events", "application/cloudevents+json",
			`{"specversion":"1.0","id":"1","source":"/s","type":"t","partitionkey":"\udc00"}`, `\udc00 is half of a UTF-16 surrogate pair`},
		{"topic with a space", "a%20b:publish", "application/json", `{"messages":[{"data":"eA=="}]}`, `invalid topic id "a b"`},
		{"topic with a NUL", "top%00ic:publish", "application/json", `{"messages":[{"data":"eA=="}]}`, `invalid topic id "top\x00ic"`},
		{"topic with a slash", "top%2Fic:publish", "application/json", `{"messages":[{"data":"eA=="}]}`, `invalid topic id "top/ic"`},
		{"topic with wildcards", "top.%2A.%3E/events", "application/cloudevents+json", `{"specversion":"1.0","id":"1","source":"/s","type":"t"}`, `invalid topic id "top.*.>"`},
		{"topic not UTF-8", "%FFtopic:publish", "application/json", `{"messages":[{"data":"eA=="}]}`, `invalid topic id`},
		{"reserved topic", "goog-topic:publish", "application/json", `{"messages":[{"data":"eA=="}]}`, `must not start with "goog"`},
	} {
		resp, err := http.Post(base+tc.path, tc.contentType, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		msg := errorMessage(t, resp)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %q, want 400 %q", tc.name, resp.StatusCode, msg, tc.msg)
		}
	}
	assertStored(t, js, project, "hostile", 0)

	// Announced, not sent: "Expect: 100-continue" makes the server answer
	// "100 Continue" once the handler reads the body, so the heap is
	// measured with every handler past its allocation.
	const conns = 16
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range conns {
		conn, err := net.Dial("tcp", sc.HTTP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		fmt.Fprintf(conn, "POST /v1/projects/%s/topics/hostile:publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", project, limit)
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 Continue") {
			t.Fatalf("waiting for 100 Continue: %q, %v", line, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d KiB for %d requests announcing %d MiB each", growth>>10, conns, limit>>20)
	if growth > 48<<20 {
		t.Fatalf("heap grew by %d MiB for %d requests that sent no body", growth>>20, conns)
	}
}

// zeroReader reads as an endless run of '0' bytes.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '0'
	}
	return len(p), nil
}
