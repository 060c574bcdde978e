// Package measure reads the process figures that fleetgraph's benchmarks
// report: CPU time and live heap. It is for benchmarks only.
package measure
