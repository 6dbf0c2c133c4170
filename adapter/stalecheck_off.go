//go:build jetorder_nostalecheck

package adapter

// staleCheck is off in this build: for the cluster chaos test's negative
// control only (stalecheck.go).
const staleCheck = false
