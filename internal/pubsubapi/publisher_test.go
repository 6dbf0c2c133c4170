package pubsubapi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/schemaapi"
	"github.com/jetorder/jetorder/internal/testutil"
)

const testProject = "schema-project"

func wantStatus(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: %v (%v), want %v", what, got, err, want)
	}
}

// The schema settings share the topic's service settings with members a
// later version may add: rewriting them keeps those.
func TestTopicSchemaServiceSettings(t *testing.T) {
	ts := &schemaapi.TopicSchema{Schema: "projects/p/schemas/s", Encoding: "BINARY", FirstRevisionID: "0000beef", SchemaUID: "u1"}
	got, err := withTopicSchema("", ts)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := topicSchemaOf("t", got); err != nil || *back != *ts {
		t.Fatalf("read back %q = %+v, %v", got, back, err)
	}

	const other = `{"ingestion":{"x":1},"schemaSettings":{"schema":"projects/p/schemas/old","encoding":"JSON"}}`
	got, err = withTopicSchema(other, ts)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, `"ingestion":{"x":1}`) || strings.Contains(got, "old") {
		t.Fatalf("withTopicSchema(other) = %s", got)
	}
	if got, err = withTopicSchema(other, nil); err != nil || got != `{"ingestion":{"x":1}}` {
		t.Fatalf("withTopicSchema(other, nil) = %s, %v", got, err)
	}
	if back, err := topicSchemaOf("t", got); err != nil || back != nil {
		t.Fatalf("read back removed = %+v, %v", back, err)
	}
	if got, err := withTopicSchema(`{"schemaSettings":{"schema":"x"}}`, nil); err != nil || got != "" {
		t.Fatalf("withTopicSchema(only schema, nil) = %q, %v", got, err)
	}
	_, err = topicSchemaOf("t", "not json")
	wantStatus(t, "unreadable settings", err, codes.Internal)
}

// The topic settings cache: a fresh entry is read once; a stale one is
// read again by one caller while the others go on with it; settings set
// through this server win over a read that started before.
func TestTopicSchemaCache(t *testing.T) {
	ctx := context.Background()
	var c topicSchemaCache
	a := &schemaapi.TopicSchema{Schema: "projects/p/schemas/a"}
	b := &schemaapi.TopicSchema{Schema: "projects/p/schemas/b"}

	loads := 0
	load := func(ts *schemaapi.TopicSchema) func(context.Context) (*schemaapi.TopicSchema, error) {
		return func(context.Context) (*schemaapi.TopicSchema, error) { loads++; return ts, nil }
	}
	for range 3 {
		if got, err := c.get(ctx, "t", load(a)); err != nil || got != a {
			t.Fatalf("get = %v, %v", got, err)
		}
	}
	if loads != 1 {
		t.Fatalf("%d reads of a fresh entry, want 1", loads)
	}
	c.set("t", b)
	if got, _ := c.get(ctx, "t", load(a)); got != b || loads != 1 {
		t.Fatalf("after set: %v (%d reads)", got, loads)
	}
	c.forget("t")
	if got, _ := c.get(ctx, "t", load(nil)); got != nil || loads != 2 {
		t.Fatalf("after forget: %v (%d reads)", got, loads)
	}

	// A read that was running when the settings were set does not replace
	// them; callers meanwhile wait for the first read of an uncached topic.
	started, release := make(chan struct{}), make(chan struct{})
	slow := func(context.Context) (*schemaapi.TopicSchema, error) {
		close(started)
		<-release
		return a, nil
	}
	first := make(chan *schemaapi.TopicSchema, 1)
	go func() {
		got, _ := c.get(ctx, "u", slow)
		first <- got
	}()
	<-started
	waiter := make(chan *schemaapi.TopicSchema, 1)
	go func() {
		got, _ := c.get(ctx, "u", func(context.Context) (*schemaapi.TopicSchema, error) { return nil, errors.New("a second read") })
		waiter <- got
	}()
	c.set("u", b)
	close(release)
	if got := <-first; got != a {
		t.Fatalf("the slow read returned %v", got)
	}
	if got := <-waiter; got != b {
		t.Fatalf("the waiting caller got %v, want the settings set", got)
	}
	if got, _ := c.get(ctx, "u", load(a)); got != b {
		t.Fatalf("after the slow read: %v, want the settings set", got)
	}

	// A stale entry: one caller reads again, the others get the stale
	// settings meanwhile.
	c.mu.Lock()
	c.entries["u"].at = time.Now().Add(-2 * topicSettingsTTL)
	c.mu.Unlock()
	started, release = make(chan struct{}), make(chan struct{})
	go func() {
		got, _ := c.get(ctx, "u", func(context.Context) (*schemaapi.TopicSchema, error) {
			close(started)
			<-release
			return a, nil
		})
		first <- got
	}()
	<-started
	if got, err := c.get(ctx, "u", func(context.Context) (*schemaapi.TopicSchema, error) { return nil, errors.New("a second read") }); err != nil || got != b {
		t.Fatalf("during the read again: %v, %v; want the stale settings", got, err)
	}
	close(release)
	if got := <-first; got != a {
		t.Fatalf("the read again returned %v", got)
	}
	if got, _ := c.get(ctx, "u", load(nil)); got != a {
		t.Fatalf("after the read again: %v", got)
	}

	// A topic that is gone is not kept.
	missing := status.Error(codes.NotFound, "topic not found")
	c.mu.Lock()
	c.entries["u"].at = time.Now().Add(-2 * topicSettingsTTL)
	c.mu.Unlock()
	if _, err := c.get(ctx, "u", func(context.Context) (*schemaapi.TopicSchema, error) { return nil, missing }); status.Code(err) != codes.NotFound {
		t.Fatalf("get of a deleted topic: %v", err)
	}
	c.mu.Lock()
	_, kept := c.entries["u"]
	c.mu.Unlock()
	if kept {
		t.Fatal("the settings of a deleted topic are kept")
	}
}

// Schema settings set through one server apply to its next Publish at
// once, and to another server's within topicSettingsTTL.
func TestPublishTopicSchemaAcrossServers(t *testing.T) {
	ctx := context.Background()
	srv := testutil.Server(t)
	newServer := func() *Server {
		b := broker.New(testutil.Connect(t, srv.ClientURL()), nil, nil)
		t.Cleanup(b.Close)
		s := New(b, Config{})
		t.Cleanup(s.Close)
		return s
	}
	one, other := newServer(), newServer()
	schemaName := "projects/" + testProject + "/schemas/states"
	if _, err := one.cfg.Schemas.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + testProject, SchemaId: "states",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: `syntax = "proto3"; message State { string name = 1; }`}}); err != nil {
		t.Fatal(err)
	}
	topic := "projects/" + testProject + "/topics/states"
	if _, err := one.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	publish := func(s *Server, data string) error {
		_, err := s.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: []*pb.PubsubMessage{{Data: []byte(data)}}})
		return err
	}
	// Both cache the topic without schema.
	wantStatus(t, "publish before", publish(one, "anything"), codes.OK)
	wantStatus(t, "publish before, other server", publish(other, "anything"), codes.OK)

	if _, err := one.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic:      &pb.Topic{Name: topic, SchemaSettings: &pb.SchemaSettings{Schema: schemaName, Encoding: pb.Encoding_JSON}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings"}},
	}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "publish after", publish(one, "anything"), codes.InvalidArgument)
	wantStatus(t, "publish after, valid", publish(one, `{"name":"Alaska"}`), codes.OK)
	testutil.Eventually(t, 5*topicSettingsTTL+time.Second, func() bool {
		return status.Code(publish(other, "anything")) == codes.InvalidArgument
	}, "the other server still publishes without the schema")

	// Removed through the other server.
	if _, err := other.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic: &pb.Topic{Name: topic}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings"}},
	}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "publish after removal, other server", publish(other, "anything"), codes.OK)
	testutil.Eventually(t, 5*topicSettingsTTL+time.Second, func() bool {
		return publish(one, "anything") == nil
	}, "the first server still validates against the removed schema")

	// Deleted and created again without schema through the other server.
	if _, err := one.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic:      &pb.Topic{Name: topic, SchemaSettings: &pb.SchemaSettings{Schema: schemaName, Encoding: pb.Encoding_JSON}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"schema_settings"}},
	}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "publish with schema", publish(one, "anything"), codes.InvalidArgument)
	if _, err := other.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*topicSettingsTTL+time.Second, func() bool {
		return publish(one, "anything") == nil
	}, "the first server still validates a topic created again without schema")
}
