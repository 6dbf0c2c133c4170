//go:build !unix

package embedded

// storeLock does nothing where flock is missing: two processes on one
// store are not detected there.
type storeLock struct{}

func lockStore(string) (*storeLock, error) { return &storeLock{}, nil }

func (*storeLock) release() {}
