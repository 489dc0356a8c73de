"""How the learner makes batches: on-policy strategies (`onpolicy`), replay paced to a ratio
(`replay`), batch axes and joining (`axes`)."""
