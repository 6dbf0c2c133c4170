package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Charts: with -charts DIR the bench also writes each comparison it prints
// as an SVG bar chart, drawn from the figures this run measured, each of
// jetorder's bars beside the baseline measured in the same run (raw
// JetStream unless the chart names another). make bench writes them into
// docs/bench, where docs/BENCHMARKS.md shows them beside its tables.

var chartsDir = flag.String("charts", "", "also write the comparisons as SVG bar charts into this directory (make bench: docs/bench)")

// A chart is one SVG file: a title, and groups of horizontal bars, each
// group on a scale of its own.
type chart struct {
	name   string // file name, without .svg
	title  string
	note   string // how the figures were made: medians, rounds
	groups []barGroup
}

// A barGroup is one measurement: what was measured and its unit, and a
// bar per contender.
type barGroup struct {
	title string
	bars  []bar
}

type bar struct {
	label    string
	value    float64 // the bar's length on its group's scale; 0 draws none
	text     string  // after the bar: the figure and its ratio to the baseline
	baseline bool    // drawn grey: what the others are compared with
}

// Layout, in pixels.
const (
	labelWidth = 290 // the labels, right-aligned
	barArea    = 300 // the longest bar of a group
	textWidth  = 370 // the figures after the bars
	chartWidth = labelWidth + barArea + textWidth
	rowHeight  = 22
	barHeight  = 14
	groupGap   = 30
	baseColor  = "#9aa0a6"
	oursColor  = "#1a73e8"
	textColor  = "#202124"
	noteColor  = "#5f6368"
	fontFamily = "-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
	noteChars  = 150 // a line of 11-pixel text that fits the width
)

// writeSVG draws c, with run (the command, when and where) under the
// title.
func (c chart) writeSVG(w io.Writer, run string) error {
	notes := append(wrap(run, noteChars), wrap(c.note, noteChars)...)
	rows := 0
	for _, g := range c.groups {
		rows += len(g.bars)
	}
	legend := 46 + len(notes)*16 + 4
	top := legend + 12
	height := top + len(c.groups)*groupGap + rows*rowHeight + 10

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n",
		chartWidth, height, chartWidth, height, esc(c.title))
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", esc(c.title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<g font-family="%s" fill="%s">`+"\n", esc(fontFamily), textColor)
	fmt.Fprintf(&b, `<text x="10" y="26" font-size="16" font-weight="bold">%s</text>`+"\n", esc(c.title))
	for i, line := range notes {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="11" fill="%s">%s</text>`+"\n", 46+i*16, noteColor, esc(line))
	}
	fmt.Fprintf(&b, `<rect x="10" y="%d" width="12" height="12" fill="%s"/><text x="28" y="%d" font-size="11">baseline, measured in the same run</text>`+"\n",
		legend, baseColor, legend+10)
	fmt.Fprintf(&b, `<rect x="240" y="%d" width="12" height="12" fill="%s"/><text x="258" y="%d" font-size="11">jetorder</text>`+"\n",
		legend, oursColor, legend+10)

	y := top
	for _, g := range c.groups {
		y += groupGap
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", y-8, esc(g.title))
		longest := 0.0
		for _, r := range g.bars {
			longest = math.Max(longest, r.value)
		}
		for _, r := range g.bars {
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12" text-anchor="end">%s</text>`+"\n", labelWidth-8, y+barHeight-3, esc(r.label))
			width := 0.0
			if r.value > 0 && longest > 0 {
				width = math.Max(1, barArea*r.value/longest) // the smallest figure stays visible
				color := oursColor
				if r.baseline {
					color = baseColor
				}
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelWidth, y, width, barHeight, color)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", float64(labelWidth)+width+6, y+barHeight-3, esc(r.text))
			y += rowHeight
		}
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks s into lines of at most width bytes, between words.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

// writeCharts writes each chart into dir as <name>.svg.
func writeCharts(dir string, charts []chart) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	run := runDescription()
	for _, c := range charts {
		f, err := os.Create(filepath.Join(dir, c.name+".svg"))
		if err != nil {
			return err
		}
		err = c.writeSVG(f, run)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Printf("chart: %s\n", filepath.Join(dir, c.name+".svg"))
	}
	return nil
}

// runDescription says when, where and how the figures were measured: the
// date, the flags that differ from the defaults (but -charts), the CPUs,
// Go and nats-server.
func runDescription() string {
	var flags []string
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "charts" {
			flags = append(flags, "-"+f.Name+" "+f.Value.String())
		}
	})
	cmd := "go run ./bench"
	if len(flags) > 0 {
		cmd += " " + strings.Join(flags, " ")
	}
	return fmt.Sprintf("%s, %s; %d CPUs, %s, nats-server %s, %d-byte payloads",
		cmd, time.Now().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), server.VERSION, *payloadSize)
}

// count writes v rounded, with thousands separated: 163,199.
func count(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// rateBar is a bar of messages (or keys) per second, with its ratios to the
// baselines named in vs.
func rateBar(label string, rate float64, vs ...string) bar {
	text := count(rate)
	if len(vs) > 0 {
		text += " (" + strings.Join(vs, ", ") + ")"
	}
	return bar{label: label, value: rate, text: text}
}

// baseBar is rateBar for a baseline.
func baseBar(label string, rate float64, vs ...string) bar {
	b := rateBar(label, rate, vs...)
	b.baseline = true
	return b
}

// vs is a ratio to a named baseline: "0.76x raw".
func vs(ratioValue float64, baseline string) string { return ratio(ratioValue) + " " + baseline }

// durationBar is a latency bar (lower is better); ok false draws none.
func durationBar(label string, d time.Duration, ok bool, baseline bool, text string) bar {
	if !ok {
		return bar{label: label, text: text, baseline: baseline}
	}
	return bar{label: label, value: d.Seconds(), text: text, baseline: baseline}
}
