"""Trust in the skill itself: its signature, its code anchors, and the real sources they cite."""
