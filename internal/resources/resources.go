// Package resources reads a file that declares Pub/Sub topics,
// subscriptions and schemas (the sidecar's --resources) and applies it
// through the Pub/Sub API, so that an app finds them when it starts.
//
// The file is YAML or JSON, shaped as the REST API's resources (camelCase
// field names: ackDeadlineSeconds, deadLetterPolicy.deadLetterTopic),
// grouped by project and keyed by id:
//
//	projects:
//	  my-project:
//	    schemas:
//	      order: {type: AVRO, definition: '{"type": "record", ...}'}
//	    topics:
//	      orders: {labels: {jetorder-key-streams: "4"}}
//	    subscriptions:
//	      orders-worker: {topic: orders, enableMessageOrdering: true}
//
// Load and Parse check the file's shape and report each problem with its
// line (ErrInvalid); the values themselves are checked by the API when
// Apply creates or updates a resource, exactly as a client's request is.
// docs/RUNNING.md ("Declared resources") is the reference of the format
// and of what Apply does.
package resources

import (
	"os"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// File is a parsed resources file: what it declares, each kind in the
// order of the file. Apply reads it and changes nothing in it, so one
// File may be applied again, or by several goroutines at once.
type File struct {
	Path          string // as given to Load or Parse, for messages
	Schemas       []*Schema
	Topics        []*Topic
	Subscriptions []*Subscription
}

// Decl is where a resource is declared.
type Decl struct {
	Project, ID string
	Line        int // of its id
	given       *given
}

// Schema is a declared schema: its Name (projects/P/schemas/ID), Type and
// Definition.
type Schema struct {
	Decl
	Schema *pb.Schema
}

// Topic is a declared topic: its Name (projects/P/topics/ID) and the
// fields the file gives; references to schemas are full names.
type Topic struct {
	Decl
	Topic *pb.Topic
}

// Subscription is a declared subscription: its Name
// (projects/P/subscriptions/ID) and the fields the file gives;
// references to topics are full names.
type Subscription struct {
	Decl
	Subscription *pb.Subscription
}

// Load reads and parses the file at path (Parse).
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses a resources file's content; name is the file's name in
// messages. A file that is not valid returns every problem found (up to
// 20), each an *Error wrapping ErrInvalid, joined. An empty file declares
// nothing.
func Parse(name string, data []byte) (*File, error) {
	p := &parser{f: &File{Path: name}}
	p.parse(data)
	if err := p.err(); err != nil {
		return nil, err
	}
	return p.f, nil
}
