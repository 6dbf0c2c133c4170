package integration

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func jetstreamOf(t *testing.T, e *env) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
