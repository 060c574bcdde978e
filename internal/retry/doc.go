// Package retry spreads retry and resync delays, so that clusters or
// edges that failed together do not retry in lockstep.
package retry
