//go:build !race

package integration

// raceSlowdown: see race_on_test.go.
const raceSlowdown = 1
