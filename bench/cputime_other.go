//go:build !unix

package main

import "time"

// cpuTime is 0 where the bench does not read the process's CPU time: the
// auth run's CPU figures then read 0.
func cpuTime() time.Duration { return 0 }
