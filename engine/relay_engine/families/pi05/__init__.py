"""pi0.5, the robot policy: its learner, session, evaluation, output and library trainer."""
