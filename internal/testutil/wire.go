package testutil

import (
	"bytes"
	"net/textproto"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// NATSWire sends h through the NATS header wire format and returns what a
// receiver reads: every name must be a token and every value must survive
// nats.go's writer (which trims spaces and replaces line breaks) unchanged.
func NATSWire(t testing.TB, h nats.Header) nats.Header {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	for name, vals := range h {
		if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == ':' }) {
			t.Fatalf("header name %q is not a token", name)
		}
		for _, v := range vals {
			if v != textproto.TrimString(v) || strings.ContainsAny(v, "\r\n") {
				t.Fatalf("header %s value %q would be changed by the wire", name, v)
			}
			b.WriteString(name + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	back, err := nats.DecodeHeadersMsg(b.Bytes())
	if err != nil {
		t.Fatalf("headers %v do not decode: %v", h, err)
	}
	return back
}
