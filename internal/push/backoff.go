package push

import (
	"math/rand/v2"
	"time"
)

// Defaults for a push subscription without a retry policy: Pub/Sub's
// push backoff, which pauses delivery for between 100 milliseconds and 60
// seconds after negative acknowledgements. A subscription with a retry
// policy uses its minimum_backoff and maximum_backoff instead (10 s and
// 600 s when the policy leaves them unset).
const (
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 60 * time.Second
)

// Backoff returns the delay before delivery attempt attempt+1 of a key
// after attempt failed ones (attempt counts from 1): minBackoff doubled
// attempt-1 times, capped at maxBackoff, less up to a fifth of it at
// random so that keys that failed together do not retry together. The
// result is always within [minBackoff, maxBackoff].
//
// minBackoff <= 0 is 0, but the doubling then starts from
// DefaultMinBackoff; maxBackoff below minBackoff is minBackoff. Safe for
// concurrent use.
func Backoff(attempt int, minBackoff, maxBackoff time.Duration) time.Duration {
	minBackoff = max(minBackoff, 0)
	maxBackoff = max(maxBackoff, minBackoff)
	if maxBackoff == 0 {
		return 0
	}
	base := minBackoff
	if base == 0 {
		base = DefaultMinBackoff
	}
	d := base
	for i := 1; i < attempt && d < maxBackoff; i++ {
		if d > maxBackoff/2 {
			d = maxBackoff
			break
		}
		d *= 2
	}
	d = min(d, maxBackoff)
	if j := d / 5; j > 0 {
		d -= rand.N(j + 1)
	}
	return max(d, minBackoff)
}
