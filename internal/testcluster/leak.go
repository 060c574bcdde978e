package testcluster

import "go.uber.org/goleak"

// LeakOptions are the goroutines goleak must ignore in tests that talk to
// clusters with client-go: klog's flush daemon and client-go's
// process-wide watchers start on first use and live for the process.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Type).updateUnfinishedWorkLoop"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.BackoffUntilWithContext.func1"),
	}
}
