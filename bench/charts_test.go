package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A chart is well-formed SVG holding its title, every label and figure,
// with the characters XML reserves escaped.
func TestChartSVG(t *testing.T) {
	c := chart{name: "ordered", title: "Ordered delivery <per key> & raw", note: "median of 3 rounds", groups: []barGroup{
		{title: "messages/s", bars: []bar{
			baseBar("raw JetStream, MaxAckPending 1000", 163_199),
			rateBar("adapter, 1 key", 18_734, vs(0.1148, "MaxAckPending 1000"), vs(0.76, "MaxAckPending 1")),
			{label: "per-key", text: "undelivered"}, // no bar
		}},
		{title: "p99", bars: []bar{
			durationBar("raw JetStream", 1500*time.Microsecond, true, true, "1.5ms"),
			durationBar("partitioned", 4100*time.Microsecond, true, false, "4.1ms (2.73x raw)"),
		}},
	}}
	var out bytes.Buffer
	if err := c.writeSVG(&out, "go run ./bench -rounds 1, 2026-11-25"); err != nil {
		t.Fatal(err)
	}
	svg := out.String()

	d := xml.NewDecoder(strings.NewReader(svg))
	var root xml.Name
	var texts []string
	rects := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root.Local == "" {
				root = tok.Name
			}
			if tok.Name.Local == "rect" {
				rects++
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(tok)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	if root.Space != "http://www.w3.org/2000/svg" || root.Local != "svg" {
		t.Errorf("root element %v, want svg in the SVG namespace", root)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{
		"Ordered delivery <per key> & raw", "go run ./bench -rounds 1, 2026-11-25", "median of 3 rounds",
		"raw JetStream, MaxAckPending 1000", "163,199", "adapter, 1 key", "18,734 (0.11x MaxAckPending 1000, 0.76x MaxAckPending 1)",
		"undelivered", "1.5ms", "4.1ms (2.73x raw)",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the chart's text lacks %q:\n%s", want, all)
		}
	}
	// The background, two legend keys, and a bar per figure but the one
	// without a value.
	if want := 3 + 4; rects != want {
		t.Errorf("%d rect elements, want %d", rects, want)
	}
}

func TestWrap(t *testing.T) {
	s := "go run ./bench -rounds 1 -scale 0.2 -keys 1,16,256 -modes-keys 20000 -modes-rate 5000, 2026-11-25"
	lines := wrap(s, 30)
	for _, l := range lines {
		if len(l) > 30 {
			t.Errorf("line %q is over 30 bytes", l)
		}
	}
	if got := strings.Join(lines, " "); got != s {
		t.Errorf("wrap lost words: %q", got)
	}
	if lines := wrap("", 30); len(lines) != 0 {
		t.Errorf("wrap(\"\") = %q, want no lines", lines)
	}
}

func TestCount(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 163_199.4: "163,199", 1_000_000: "1,000,000", -1234: "-1,234"} {
		if got := count(v); got != want {
			t.Errorf("count(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestWriteCharts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bench")
	if err := writeCharts(dir, []chart{{name: "a", title: "A"}, {name: "b", title: "B"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a.svg", "b.svg"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.HasPrefix(b, []byte("<svg ")) {
			t.Errorf("%s: %v, %.20q", name, err, b)
		}
	}
}
