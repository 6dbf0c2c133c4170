package sidecar

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Every method of the Pub/Sub services the sidecar serves is classified
// here, so that a method added to the protos fails this test until someone
// decides whether it changes state (and must wait for sync).
func TestReadOnlyRPC(t *testing.T) {
	changes := map[string]bool{ // by "Service/Method": true when it must sync
		"Publisher/CreateTopic": true, "Publisher/UpdateTopic": true, "Publisher/DeleteTopic": true,
		"Publisher/DetachSubscription": true,
		"Publisher/Publish":            false, // the adapter syncs publishes itself
		"Publisher/GetTopic":           false, "Publisher/ListTopics": false,
		"Publisher/ListTopicSubscriptions": false, "Publisher/ListTopicSnapshots": false,

		"Subscriber/CreateSubscription": true, "Subscriber/UpdateSubscription": true,
		"Subscriber/DeleteSubscription": true, "Subscriber/ModifyPushConfig": true,
		"Subscriber/CreateSnapshot": true, "Subscriber/UpdateSnapshot": true, "Subscriber/DeleteSnapshot": true,
		"Subscriber/Seek":            true,
		"Subscriber/GetSubscription": false, "Subscriber/ListSubscriptions": false,
		"Subscriber/GetSnapshot": false, "Subscriber/ListSnapshots": false,
		// consumer-side: acks may roll back in a cut (delivery is at least once)
		"Subscriber/Pull": false, "Subscriber/StreamingPull": false,
		"Subscriber/Acknowledge": false, "Subscriber/ModifyAckDeadline": false,

		"SchemaService/CreateSchema": true, "SchemaService/CommitSchema": true,
		"SchemaService/RollbackSchema": true, "SchemaService/DeleteSchemaRevision": true,
		"SchemaService/DeleteSchema": true,
		"SchemaService/GetSchema":    false, "SchemaService/ListSchemas": false,
		"SchemaService/ListSchemaRevisions": false, "SchemaService/ValidateSchema": false,
		"SchemaService/ValidateMessage": false,
	}
	seen := 0
	for _, f := range []protoreflect.FileDescriptor{pubsubpb.File_google_pubsub_v1_pubsub_proto, pubsubpb.File_google_pubsub_v1_schema_proto} {
		services := f.Services()
		for i := range services.Len() {
			sd := services.Get(i)
			methods := sd.Methods()
			for j := range methods.Len() {
				name := string(sd.Name()) + "/" + string(methods.Get(j).Name())
				want, ok := changes[name]
				if !ok {
					t.Errorf("%s: not classified; add it to this test as changing state or not", name)
					continue
				}
				seen++
				full := "/" + string(sd.FullName()) + "/" + string(methods.Get(j).Name())
				if got := !readOnlyRPC(full); got != want {
					t.Errorf("%s syncs: %v, want %v", full, got, want)
				}
			}
		}
	}
	if seen != len(changes) {
		t.Errorf("%d methods classified, %d found in the protos: the table names a method that is gone", len(changes), seen)
	}
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if !readOnlyRPC(m) {
			t.Errorf("%s syncs; it changes nothing", m)
		}
	}
}

// A changing request answers only after the sync; when the sync fails, the
// caller gets 503 and none of the handler's response; reads never sync.
func TestSyncHTTP(t *testing.T) {
	var syncs int
	var syncErr error
	h := syncHTTP(func(context.Context) error { syncs++; return syncErr }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	do := func(method string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/v1/projects/p/topics/t", nil))
		return rec
	}
	if rec := do(http.MethodGet); rec.Code != 200 || syncs != 0 {
		t.Fatalf("GET: %d, %d syncs; want 200 and none", rec.Code, syncs)
	}
	if rec := do(http.MethodPut); rec.Code != 200 || syncs != 1 || rec.Body.String() != `{"ok":true}` {
		t.Fatalf("PUT: %d %q, %d syncs; want 200, the handler's body, one sync", rec.Code, rec.Body, syncs)
	}
	// A handler that writes nothing still waits for the sync; so does a
	// flush; publishing (synced by the adapter) does not.
	empty := syncHTTP(func(context.Context) error { syncs++; return nil }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/flush" {
			_ = http.NewResponseController(w).Flush()
		}
	}))
	for _, path := range []string{"/v1/projects/p/topics/t", "/flush"} {
		before := syncs
		rec := httptest.NewRecorder()
		empty.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, path, nil))
		if rec.Code != 200 || syncs != before+1 {
			t.Fatalf("DELETE %s writing nothing: %d, %d syncs; want 200 after one sync", path, rec.Code, syncs-before)
		}
	}
	before := syncs
	empty.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/projects/p/topics/t:publish", nil))
	if syncs != before {
		t.Fatalf(":publish synced in the HTTP layer; the adapter does that")
	}
	syncErr = errors.New("disk gone")
	rec := do(http.MethodPost)
	if rec.Code != http.StatusServiceUnavailable || strings.Contains(rec.Body.String(), "ok") || !strings.Contains(rec.Body.String(), "disk gone") {
		t.Fatalf("POST with a failing sync: %d %q; want 503 naming the cause, without the handler's body", rec.Code, rec.Body)
	}
}
