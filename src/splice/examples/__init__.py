"""Applications built on splice: the velocity-masked CartPole task and a recurrent DQN agent."""
