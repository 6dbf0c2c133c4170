package testutil

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer is an io.Writer safe for concurrent use, for a logger under
// test: the log's goroutines write while the test reads.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines are the complete lines written so far.
func (b *LogBuffer) Lines() []string {
	s := b.String()
	s = s[:strings.LastIndexByte(s, '\n')+1]
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}
