package access

import (
	"os"
	"testing"

	"github.com/jetorder/jetorder/internal/itest"
)

// TestMain stops Google's emulator, which TestNodeClientHotKey starts,
// once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	itest.StopEmulator()
	os.Exit(code)
}
