"""The step loop's host side: the Scheduler and its policy, the block manager, and the Request that
crosses every boundary."""
