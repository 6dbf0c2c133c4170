package resources

import (
	"errors"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Every field the format has, in YAML, becomes the API's resource; ids
// become names and references full names.
func TestParseFields(t *testing.T) {
	const file = `
projects:
  p:
    schemas:
      s: {type: PROTOCOL_BUFFER, definition: 'syntax = "proto3"; message M { string id = 1; }'}
    topics:
      t:
        labels: {team: checkout, jetorder-key-streams: 4, empty: }
        messageRetentionDuration: 1h30m
        schemaSettings: {schema: s, encoding: BINARY, firstRevisionId: a, lastRevisionId: b}
      dl:
    subscriptions:
      sub:
        topic: t
        ackDeadlineSeconds: 30
        retainAckedMessages: true
        messageRetentionDuration: 600s
        labels: {jetorder-ordering: pipelined}
        enableMessageOrdering: true
        enableExactlyOnceDelivery: false
        filter: attributes:k
        expirationPolicy: {}
        deadLetterPolicy: {deadLetterTopic: projects/other/topics/dl, maxDeliveryAttempts: 7}
        retryPolicy: {minimumBackoff: 1s, maximumBackoff: 1m}
        pushConfig:
          pushEndpoint: http://127.0.0.1:9/push
          attributes: {x-goog-version: v1}
          oidcToken: {serviceAccountEmail: a@b.iam.gserviceaccount.com, audience: aud}
          noWrapper: {writeMetadata: true}
  q:
    subscriptions:
      wrapped: {topic: projects/p/topics/t, pushConfig: {pushEndpoint: "http://127.0.0.1:9/", pubsubWrapper: {}}}
`
	f, err := Parse("r.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Schemas) != 1 || len(f.Topics) != 2 || len(f.Subscriptions) != 2 {
		t.Fatalf("parsed %d schemas, %d topics, %d subscriptions", len(f.Schemas), len(f.Topics), len(f.Subscriptions))
	}
	check := func(what string, got, want proto.Message) {
		t.Helper()
		if !proto.Equal(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", what, got, want)
		}
	}
	check("schema", f.Schemas[0].Schema, &pb.Schema{Name: "projects/p/schemas/s", Type: pb.Schema_PROTOCOL_BUFFER,
		Definition: `syntax = "proto3"; message M { string id = 1; }`})
	check("topic", f.Topics[0].Topic, &pb.Topic{
		Name:                     "projects/p/topics/t",
		Labels:                   map[string]string{"team": "checkout", "jetorder-key-streams": "4", "empty": ""},
		MessageRetentionDuration: durationpb.New(90 * time.Minute),
		SchemaSettings:           &pb.SchemaSettings{Schema: "projects/p/schemas/s", Encoding: pb.Encoding_BINARY, FirstRevisionId: "a", LastRevisionId: "b"},
	})
	check("topic with nothing", f.Topics[1].Topic, &pb.Topic{Name: "projects/p/topics/dl"})
	check("subscription", f.Subscriptions[0].Subscription, &pb.Subscription{
		Name:                     "projects/p/subscriptions/sub",
		Topic:                    "projects/p/topics/t",
		AckDeadlineSeconds:       30,
		RetainAckedMessages:      true,
		MessageRetentionDuration: durationpb.New(10 * time.Minute),
		Labels:                   map[string]string{"jetorder-ordering": "pipelined"},
		EnableMessageOrdering:    true,
		Filter:                   "attributes:k",
		ExpirationPolicy:         &pb.ExpirationPolicy{},
		DeadLetterPolicy:         &pb.DeadLetterPolicy{DeadLetterTopic: "projects/other/topics/dl", MaxDeliveryAttempts: 7},
		RetryPolicy:              &pb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second), MaximumBackoff: durationpb.New(time.Minute)},
		PushConfig: &pb.PushConfig{
			PushEndpoint:         "http://127.0.0.1:9/push",
			Attributes:           map[string]string{"x-goog-version": "v1"},
			AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: "a@b.iam.gserviceaccount.com", Audience: "aud"}},
			Wrapper:              &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}},
		},
	})
	check("subscription of another project's topic", f.Subscriptions[1].Subscription, &pb.Subscription{
		Name:       "projects/q/subscriptions/wrapped",
		Topic:      "projects/p/topics/t",
		PushConfig: &pb.PushConfig{PushEndpoint: "http://127.0.0.1:9/", Wrapper: &pb.PushConfig_PubsubWrapper_{PubsubWrapper: &pb.PushConfig_PubsubWrapper{}}},
	})
	if s := f.Subscriptions[0]; s.Project != "p" || s.ID != "sub" || s.Line != 13 {
		t.Errorf("subscription declared at %s/%s line %d, want p/sub line 13", s.Project, s.ID, s.Line)
	}
}

// JSON is YAML too, tab-indented JSON included; anchors and merge keys
// share settings.
func TestParseJSONAndAnchors(t *testing.T) {
	json := "{\n\t\"projects\": {\n\t\t\"p\": {\n\t\t\t\"topics\": {\"t\": {\"messageRetentionDuration\": \"86400s\"}},\n" +
		"\t\t\t\"subscriptions\": {\"s\": {\"topic\": \"t\", \"ackDeadlineSeconds\": 20, \"enableMessageOrdering\": true}}\n\t\t}\n\t}\n}\n"
	f, err := Parse("r.json", []byte(json))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Subscriptions[0].Subscription; got.GetAckDeadlineSeconds() != 20 || !got.GetEnableMessageOrdering() || got.GetTopic() != "projects/p/topics/t" {
		t.Errorf("JSON subscription: %v", got)
	}
	if got := f.Topics[0].Topic.GetMessageRetentionDuration().AsDuration(); got != 24*time.Hour {
		t.Errorf("JSON retention %v", got)
	}

	// x- keys beside projects are for anchors, as in compose files.
	const yaml = `
x-ordered: &ordered {enableMessageOrdering: true, ackDeadlineSeconds: 60}
projects:
  p:
    topics:
      t: &topic {labels: {team: a}}
      u: *topic
    subscriptions:
      a: {<<: *ordered, topic: t}
      b: {<<: *ordered, topic: t, ackDeadlineSeconds: 10}
`
	f, err = Parse("r.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	a, b := f.Subscriptions[0].Subscription, f.Subscriptions[1].Subscription
	if a.GetAckDeadlineSeconds() != 60 || b.GetAckDeadlineSeconds() != 10 || !b.GetEnableMessageOrdering() || b.GetTopic() != "projects/p/topics/t" {
		t.Errorf("merged: a %v, b %v", a, b)
	}
	if f.Topics[1].Topic.GetLabels()["team"] != "a" || f.Topics[1].Topic.GetName() != "projects/p/topics/u" {
		t.Errorf("alias: %v", f.Topics[1].Topic)
	}
}

// Each problem is reported with the file, the line and the resource, and
// wraps ErrInvalid; every problem of a file is reported at once.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"unknown field", `
projects:
  p:
    subscriptions:
      orders:
        topic: t
        ackDeadline: 10
`, []string{`r.yaml:7: subscription "orders": unknown field "ackDeadline"`}},
		{"proto names", `
projects:
  p:
    subscriptions:
      orders: {topic: t, ack_deadline_seconds: 10, push_config: {push_endpoint: x}}
`, []string{`r.yaml:5: subscription "orders": unknown field "ack_deadline_seconds": the file has the REST API's names, "ackDeadlineSeconds"`,
			`r.yaml:5: subscription "orders": unknown field "push_config": the file has the REST API's names, "pushConfig"`}},
		{"both wrappers", `
projects:
  p:
    subscriptions:
      orders: {topic: t, pushConfig: {pushEndpoint: x, pubsubWrapper: {}, noWrapper: {}}}
`, []string{`r.yaml:5: subscription "orders": fields "pushConfig.pubsubWrapper" and "pushConfig.noWrapper" exclude each other`}},
		{"unknown nested field", `
projects:
  p:
    subscriptions:
      orders: {topic: t, retryPolicy: {minBackoff: 1s}}
`, []string{`r.yaml:5: subscription "orders": unknown field "retryPolicy.minBackoff"`}},
		{"not supported", `
projects:
  p:
    subscriptions:
      orders: {topic: t, bigqueryConfig: {table: x}}
    topics:
      t: {kmsKeyName: k}
`, []string{`r.yaml:5: subscription "orders": field "bigqueryConfig" is not supported by the sidecar`,
			`r.yaml:7: topic "t": field "kmsKeyName" is not supported by the sidecar`}},
		{"wrong types", `
projects:
  p:
    subscriptions:
      orders:
        topic: t
        ackDeadlineSeconds: soon
        enableMessageOrdering: maybe
        labels: [a, b]
        retryPolicy: 10s
        filter: ~
`, []string{`r.yaml:7: subscription "orders": field "ackDeadlineSeconds": want an integer, not "soon"`,
			`r.yaml:8: subscription "orders": field "enableMessageOrdering": want true or false, not "maybe"`,
			`r.yaml:9: subscription "orders": field "labels": want a mapping of strings, not a list`,
			`r.yaml:10: subscription "orders": field "retryPolicy": want a mapping of fields, not "10s"`,
			`r.yaml:11: subscription "orders": field "filter": want a string, not null`}},
		{"missing topic", `
projects:
  p:
    subscriptions:
      orders:
        ackDeadlineSeconds: 10
`, []string{`r.yaml:5: subscription "orders": missing field "topic"`}},
		{"bad durations", `
projects:
  p:
    topics:
      t: {messageRetentionDuration: 10 minutes}
    subscriptions:
      s: {topic: t, expirationPolicy: {ttl: -1h}, retryPolicy: {minimumBackoff: 10}}
`, []string{`r.yaml:5: topic "t": field "messageRetentionDuration": want a duration such as 600s, 10m or 168h, not "10 minutes"`,
			`r.yaml:7: subscription "s": field "expirationPolicy.ttl": want a duration such as 600s, 10m or 168h, not "-1h"`,
			`r.yaml:7: subscription "s": field "retryPolicy.minimumBackoff": want a duration such as 600s, 10m or 168h, not "10"`}},
		{"bad references", `
projects:
  p:
    subscriptions:
      s: {topic: projects/p/subscriptions/x, deadLetterPolicy: {deadLetterTopic: ""}}
    topics:
      t: {schemaSettings: {schema: p/s}}
`, []string{`r.yaml:5: subscription "s": field "topic": "projects/p/subscriptions/x": want a topic id or projects/PROJECT/topics/ID`,
			`r.yaml:5: subscription "s": field "deadLetterPolicy.deadLetterTopic": want a topic id or projects/PROJECT/topics/ID, not ""`,
			`r.yaml:7: topic "t": field "schemaSettings.schema": "p/s": want a schema id or projects/PROJECT/schemas/ID`}},
		{"schemas", `
projects:
  p:
    schemas:
      s: {type: JSONSCHEMA, definition: x}
      u: {definition: x}
`, []string{`r.yaml:5: schema "s": field "type": want PROTOCOL_BUFFER or AVRO, not "JSONSCHEMA"`,
			`r.yaml:6: schema "u": missing field "type"`}},
		{"twice", `
projects:
  p:
    topics:
      t: {}
      t: {labels: {a: b, a: c}}
`, []string{`r.yaml:6: project "p": "t" given twice (first at line 5)`}},
		{"name", `
projects:
  p:
    topics:
      t: {name: projects/p/topics/t}
`, []string{`r.yaml:5: topic "t": field "name": the id is the declaration's key`}},
		{"shape", `
projects:
  p:
    queues: {}
    topics: [a, b]
`, []string{`r.yaml:4: project "p": unknown field "queues": want schemas, topics or subscriptions`,
			`r.yaml:5: project "p": want a mapping, not a list`}},
		{"no projects", "topics: {t: {}}\n", []string{`r.yaml:1: unknown field "topics": the file has projects`}},
		{"syntax", "projects:\n  p:\n    topics: {t: {]\n", []string{`r.yaml: not YAML or JSON: line 2: did not find expected node content`}},
		{"two documents", "projects: {}\n---\nprojects: {}\n", []string{`r.yaml:2: a second document`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(tc.file))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid", err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "r.yaml" {
				t.Errorf("Parse: %v, want an *Error of r.yaml", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Errorf("Parse reported %d problems, want %d:\n%v", len(lines), len(tc.want), err)
			}
			for _, w := range tc.want {
				found := false
				for _, l := range lines {
					found = found || strings.HasPrefix(l, w)
				}
				if !found {
					t.Errorf("no problem reads %q; got:\n%v", w, err)
				}
			}
		})
	}
}

// An empty file, or one with nothing under projects, declares nothing;
// a missing file is an error of its own.
func TestParseEmpty(t *testing.T) {
	for _, file := range []string{"", "# nothing yet\n", "projects:\n", "projects: {p: }\n", "{}"} {
		f, err := Parse("r.yaml", []byte(file))
		if err != nil || len(f.Schemas)+len(f.Topics)+len(f.Subscriptions) != 0 {
			t.Errorf("Parse(%q): %v, %v", file, f, err)
		}
	}
	if _, err := Load(t.TempDir() + "/none.yaml"); err == nil || errors.Is(err, ErrInvalid) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

// The example file of deploy/ stays valid.
func TestExampleFile(t *testing.T) {
	f, err := Load("../../deploy/resources.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Schemas) == 0 || len(f.Topics) == 0 || len(f.Subscriptions) == 0 {
		t.Errorf("the example declares %d schemas, %d topics, %d subscriptions", len(f.Schemas), len(f.Topics), len(f.Subscriptions))
	}
}

// More than maxErrors problems: the first maxErrors, and a count of the
// rest.
func TestParseManyErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("projects:\n  p:\n    topics:\n")
	for i := range 30 {
		b.WriteString("      t" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ": {bad: 1}\n")
	}
	_, err := Parse("r.yaml", []byte(b.String()))
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxErrors+1 || lines[maxErrors] != "r.yaml: 10 more problems" {
		t.Errorf("%d lines, the last %q", len(lines), lines[len(lines)-1])
	}
}
