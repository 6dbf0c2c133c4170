package sidecar

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReadOnlyRPC(t *testing.T) {
	for method, want := range map[string]bool{
		"/google.pubsub.v1.Publisher/CreateTopic":              false,
		"/google.pubsub.v1.Publisher/Publish":                  true, // the adapter syncs publishes
		"/google.pubsub.v1.Subscriber/ModifyPushConfig":        false,
		"/google.pubsub.v1.Subscriber/ModifyAckDeadline":       true,
		"/google.pubsub.v1.Subscriber/Seek":                    false,
		"/google.pubsub.v1.Subscriber/GetSubscription":         true,
		"/google.pubsub.v1.Subscriber/Acknowledge":             true,
		"/google.pubsub.v1.SchemaService/CommitSchema":         false,
		"/google.pubsub.v1.SchemaService/ValidateMessage":      true,
		"/google.pubsub.v1.Publisher/ListTopicSubscriptions":   true,
		"/google.pubsub.v1.Subscriber/DetachSubscription":      false,
		"/google.pubsub.v1.Subscriber/CreateSnapshot":          false,
		"/google.pubsub.v1.Publisher/DeleteTopic":              false,
		"/grpc.health.v1.Health/Check":                         true,
		"/google.pubsub.v1.SchemaService/DeleteSchemaRevision": false,
		"/google.pubsub.v1.Subscriber/UpdateSubscription":      false,
		"/google.pubsub.v1.Publisher/UpdateTopic":              false,
		"/google.pubsub.v1.Subscriber/Pull":                    true,
		"/google.pubsub.v1.SchemaService/ListSchemaRevisions":  true,
		"/google.pubsub.v1.Subscriber/ListSnapshots":           true,
		"/google.pubsub.v1.Subscriber/DeleteSnapshot":          false,
		"/google.pubsub.v1.SchemaService/RollbackSchema":       false,
	} {
		if got := readOnlyRPC(method); got != want {
			t.Errorf("readOnlyRPC(%s) = %v, want %v", method, got, want)
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
