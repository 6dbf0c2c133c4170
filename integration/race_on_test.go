//go:build race

package integration

// raceSlowdown is how much slower the sidecar may be than Google's
// emulator in a test built with the race detector, which slows the
// sidecar (and Google's Go client) several times and the emulator, a Java
// process, not at all (framework_test.go).
const raceSlowdown = 2
